"""Tuning per GPU with MetaSchedule: `space` (the CUDA schedule's knobs as a design space),
`database` (the JSON database, written atomically; finding the one that matches a target),
`tuner` (XGBoost + evolutionary search, resumable, with progress)."""
