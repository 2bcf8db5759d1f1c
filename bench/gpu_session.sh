#!/usr/bin/env bash
# One GPU-machine session step, run from the repo root on the device machine (after the tvm1 install call) with
# `source .devcarry/tvm2/env.sh` first. Logs and results go to $OUT (or bench/results/session).
#   [CASES="SPEC ..."] bash bench/gpu_session.sh tune MIN [N]   tune every bench case (or CASES), N trials each (default 16; resumes
#                                            .tune/db), for at most MIN minutes; copy the database out
#   bash bench/gpu_session.sh bench          ship .tune/db's best records (merged with schedules/), benchmarks (default vs tuned), model bench
#   [CASES=...] bash bench/gpu_session.sh tunebench MIN N   tune, ship and benchmark in one call
#   bash bench/gpu_session.sh model          model bench, GPU tests of the frontend and of tuning
#   [TRIALS=16 ONLY=pairs] bash bench/gpu_session.sh tunemodels MIN NAME:BATCH...   export the torchvision models, tune every distinct
#                                            pair and single conv of each (ONLY=pairs or convs: those alone) into .tune/db (resumes), MIN minutes in all
#   bash bench/gpu_session.sh shipe2e NAME:BATCH,... [COMPILE]   ship .tune/db with schedules/ into .tune/schedules (copied
#                                            to $OUT), then bench_e2e on those records (torch.compile mode COMPILE, default none)
#   bash bench/gpu_session.sh tests | tests2 the kernel's GPU tests | all other GPU tests (one call each), log to $OUT
#   bash bench/gpu_session.sh alltests       every GPU test, 8 processes (carry .devcarry/xdist: pip download pytest-xdist execnet)
#   [CASE=SPEC] bash bench/gpu_session.sh compare CFG...   one case (N=32 56x56 64->64->128) with the default, tuned and given configs
#   [CASE=SPEC KERNEL=REGEX] bash bench/gpu_session.sh ncu [CFG...]   Nsight Compute of CASE (default N=32 56x56
#                                            64->64->128; any op kind, e.g. a conv with KERNEL=conv), tuned record then each CFG
#   bash bench/gpu_session.sh epilogue       the register epilogues: GPU tests, compare and ncu
#   [CASES="SPEC ..."] bash bench/gpu_session.sh hopperncu   Nsight Compute of the Hopper pair (default config) on each case
#   bash bench/gpu_session.sh halo           bench/experiments/halo_tile.py: one halo tile vs the template (stage 1, whole op), checked
#   bash bench/gpu_session.sh hopper         sm_90's TMA + wgmma kernels (schedule/cuda_hopper_conv.py, cuda_hopper_pair.py): their GPU
#                                            tests (vs numpy; models, ResNet-50 b1/b32 included, vs onnxruntime), then bench/experiments/hopper_conv1x1.py:
#                                            ResNet-50's batch-32 1x1 convs, each config against the mma.sync kernel and cuDNN (~7 min)
#   bash bench/gpu_session.sh hopperpairs    the fused pairs (schedule/cuda_hopper_pair.py, TVM_B2B_HOPPER_PAIR=all) vs the mma.sync
#                                            template, cuDNN (~2 min)
#   bash bench/gpu_session.sh hopperconvs    ResNet-50's single convs (batch 32 and 1) on TMA + wgmma (TVM_B2B_HOPPER=all), then
#                                            on the mma.sync template (=0)
#   BASE=DIR bash bench/gpu_session.sh hopperab CFG...   the Hopper pair's dense cases on DIR's tvm_b2b (an earlier commit's),
#                                            then on this tree's with each CFG: a change against its baseline in one call
#   bash bench/gpu_session.sh singles        the dense pairs fused (mma.sync template) vs their two convs as a model runs them
#                                            unfused (the 3x3 on TMA + wgmma where it takes it): the fusion policy's measurement
#   bash bench/gpu_session.sh hopperexp      the s25 profile's experiments: pair GPU tests, one producer warp (envab)
#   [TRIALS=8] bash bench/gpu_session.sh hoppertune MIN   tune the Hopper pair's configs (tune.written) on the dense N=32 pairs,
#                                            then bench_fused default vs tuned on that database
#   [TRIALS=10 CASES="--case SPEC ..."] bash bench/gpu_session.sh clustertune [MIN]   the Hopper pair's cluster form on ResNet-50's
#                                            k1 >= 256 pairs at batch 32: GPU tests, clusters of 2-8 vs the two convs; MIN > 0: tuning too
#   [CFGS="CFG ..."] bash bench/gpu_session.sh pairdeep   the Hopper pair's pipeline depth: dense N=32 pairs, default and each CFG
#   [CASES="SPEC ..."] bash bench/gpu_session.sh sourcencu   where the Hopper kernels' warps wait, per SASS instruction (ncu)
#   [MODES="mma 0 1 sb" CASES="--spec SPEC ..." TESTS=0] bash bench/gpu_session.sh persistab   the Hopper conv's persistent grid: GPU
#                                            tests, ResNet-50's unfused batch-32 convs on mma.sync, then TMA + wgmma without and with
#                                            it (sb: without, scale and bias from shared memory, TVM_B2B_HOPPER_SB=shared)
#   bash bench/gpu_session.sh pairpersist    the Hopper pair's persistent form: its GPU tests, then ResNet-50's batch-32 pairs (the
#                                            dense sweep, the strided ones) with the default config and with TVM_B2B_HOPPER_PERSIST=1
#                                            (measured slower on every pair: no default), against the two convs as a model now runs them
#   [VAR=SWITCH MODES="1 0"] bash bench/gpu_session.sh enve2e NAME:BATCH,...   bench_e2e with a switch (default
#                                            TVM_B2B_HOPPER_PERSIST) at each of MODES
#   bash bench/gpu_session.sh tmaoverlap     whether TMA reads through a tensor map whose rows overlap (once a stem idea; the
#                                            stem now packs its taps without one: narrow_taps)
#   bash bench/gpu_session.sh hoppersweep    configs of the Hopper pair (vs its two convs) and conv (ResNet-50 batch 32): ~9 min
#   [BASE=DIR] ENVS="VAR=V ..." bash bench/gpu_session.sh envab   the Hopper pair's dense cases on DIR's tree, then this
#                                            tree's under each VAR=V: a switch's A/B in one call
#   [MODES="1 0"] bash bench/gpu_session.sh pairse2e NAME:BATCH,...   bench_e2e with TVM_B2B_HOPPER_PAIR of each of MODES
#   bash bench/gpu_session.sh hoppere2e NAME:BATCH,...   bench_e2e with TVM_B2B_HOPPER=1 (the default), then 0, on the shipped records
#   [CASES="SPEC ..."] bash bench/gpu_session.sh convs CFG...   single convs (default: ResNet-50's) with the default and each CFG
#                                            of the mma.sync template (TVM_B2B_HOPPER=0 unless given)
#   bash bench/gpu_session.sh grouped        grouped convs on tensor cores (cuda_conv's GEMM per group): their GPU tests, then ResNeXt-50's
#                                            grouped convs (batch 1 and 32) with TVM_B2B_GROUPED_TC=0 (CUDA cores), then =all (merged groups too); MODES="..." picks
#   [NS="1 32" MODES="0 1" TESTS=0 LIMIT=S] bash bench/gpu_session.sh dwpairs CFG...   MobileNetV2's depthwise pairs (fused,
#                                            grouped_pair's template; TVM_B2B_DW_STAGED each of MODES) with the default config and each
#                                            CFG, against our two kernels and cuDNN; their GPU tests first
#   bash bench/gpu_session.sh groupede2e NAME:BATCH,...   bench_e2e as shipped, then with TVM_B2B_GROUPED_TC=0 (CUDA cores)
#   [MODES="all 0"] bash bench/gpu_session.sh dwclustere2e NAME:BATCH,...   bench_e2e with TVM_B2B_DW_CLUSTER of each of MODES
#   [NS="1 32" TESTS=0 LIMIT=S] bash bench/gpu_session.sh dwcluster CFG...   MobileNetV2's depthwise pairs on sm_90's cluster kernel
#                                            (default config and each CFG, e.g. bm=16,cs=8) beside the template's fused kernel, our two
#                                            kernels and cuDNN; its GPU tests first
#   bash bench/gpu_session.sh splitk         bench/experiments/split_k.py: DeepLabV3's deep dilated convs at batch 1 (and ResNet-50's) with
#                                            each split-K factor of the mma.sync kernel, against cuDNN: what split_factor is chosen from;
#                                            the model's A/B of the candidate rule: VAR=TVM_B2B_SPLIT_DEEP MODES="0 4 8" ... enve2e
#                                            deeplabv3_resnet50:1 (cuda_conv.deep_split_waves)
#   [NS="8 32"] bash bench/gpu_session.sh dilated   the TMA + wgmma kernels on dilated convs and pairs: their GPU tests, then
#                                            DeepLabV3's dilated 3x3s (batch NS) on mma.sync (=0) and on TMA + wgmma (=all),
#                                            and its bottleneck pairs fused each way, numpy-checked: whether they become defaults
#   bash bench/gpu_session.sh legalized      the ops TVM legalizes (max-pool, the stem's input cells): our rules vs TVM's
#   bash bench/gpu_session.sh rpc            the GPU test of tuning through an RPC tracker (its tracker needs tornado, not on
#                                            the machine: carry ".devcarry/wheels" made by `pip download -d .devcarry/wheels tornado`)
# The tuning database lives in .tune/db (git-ignored): carry ".tune" with tvm2 to resume one made earlier.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .devcarry/wheels/*.whl >/dev/null 2>&1; then  # carried pure-Python wheels (the machine has no registry)
  mkdir -p /tmp/wheels && for w in .devcarry/wheels/*.whl; do python3 -m zipfile -e "$w" /tmp/wheels; done
  export PYTHONPATH="/tmp/wheels:$PYTHONPATH"
fi
out="${OUT:-bench/results/session}"; mkdir -p "$out" .tune
N32="n=32,h=56,w=56,c=64,k1=64,k2=128"
dw_bench() {  # N NAME: bench_fused on MobileNetV2's depthwise pairs at batch N with the configs in cfgs, into $out/NAME.{json,txt}
  local cases
  cases=$(python3 -c "import sys; sys.path.insert(0, 'bench'); from bench_fused import grouped_cases
print(' '.join('--case ' + s.to_string() for s in grouped_cases(False) if s.groups == s.c and s.n == $1))")
  timeout "${LIMIT:-280}" python3 bench/bench_fused.py $cases "${cfgs[@]}" --json "$out/$2.json" 2>&1 | tee "$out/$2.txt" | grep -v "^\s*$"
}
dense_pair_cases() {  # bench_fused's --case flags: the N=32 56x56 sweep, then ResNet-50's stride-1 +residual pairs at N=32
  for k2 in 64 128 256; do printf -- "--case n=32,h=56,w=56,c=64,k1=64,k2=$k2,dtype=float16 "; done
  for hc in 56,64 28,128 14,256; do printf -- "--case n=32,h=${hc%,*},w=${hc%,*},c=${hc#*,},k1=${hc#*,},k2=$((4 * ${hc#*,})),residual=1,dtype=float16 "; done
}
cluster_pair_cases() {  # ResNet-50's batch-32 pairs of k1 >= 256 (+residual): the strided and stride-1 ones of k1 = 512 and 256
  for c in "h=14,w=14,c=512,k1=512,k2=2048,stride=2" "h=7,w=7,c=512,k1=512,k2=2048" "h=28,w=28,c=256,k1=256,k2=1024,stride=2" \
           "h=14,w=14,c=256,k1=256,k2=1024"; do printf -- "--case n=32,$c,residual=1,dtype=float16 "; done
}
unfused_resnet50_convs() {  # bench_convs' --spec flags: ResNet-50's batch-32 convs that run unfused (its stem, 1x1s, strided 3x3s,
                            # last 3x3)
  for c in "h=224,w=224,c=3,k=64,kh=7,kw=7,stride=2,pad_h=3,pad_w=3" "h=56,w=56,c=64,k=64" "h=56,w=56,c=64,k=256,act=none" "h=56,w=56,c=256,k=64" "h=56,w=56,c=256,k=128" \
           "h=56,w=56,c=256,k=512,stride=2,act=none" "h=28,w=28,c=512,k=128" "h=28,w=28,c=512,k=256" \
           "h=28,w=28,c=256,k=256,kh=3,kw=3,stride=2,pad_h=1,pad_w=1" "h=28,w=28,c=512,k=1024,stride=2,act=none" \
           "h=14,w=14,c=256,k=1024,residual=1" "h=14,w=14,c=1024,k=256" "h=14,w=14,c=1024,k=2048,stride=2,act=none" \
           "h=7,w=7,c=512,k=2048,residual=1" "h=7,w=7,c=2048,k=512" "h=7,w=7,c=512,k=512,kh=3,kw=3,pad_h=1,pad_w=1"; do
    printf -- "--spec n=32,$c,dtype=float16 "
  done
}
switch_e2e() {  # VAR NAME MODELS: bench_e2e with the switch VAR at each of MODES (set by the caller), into $out/e2e_NAME_MODE
  for mode in $MODES; do
    env "$1=$mode" timeout "${LIMIT:-280}" python3 bench/bench_e2e.py --models "$3" --torch-compile none --breakdown \
      --out "$out/e2e_$2_$mode" 2>&1 | grep -v "^\s*$" | tail -${TAIL:-25}
  done
}
quiet() { grep -v -E "\[(INFO|DEBUG)\]|^ *$|^-+$|^ ID \||^ +[0-9]+ \| main|^Total" ; }
case "$1" in
  tune)
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    specs=$( (if [ -n "${CASES:-}" ]; then tr ' ' '\n' <<< "$CASES"; else python3 bench/bench_fused.py --list; fi) | sed 's/^/--spec /')
    timeout $(( ${2:-5} * 60 + 60 )) python3 -m tvm_b2b tune $specs --target cuda --trials "${3:-16}" --db .tune/db \
      --minutes "${2:-5}" 2>&1 | quiet | tee "$out/tune.log" | grep -E "^\[|^n=|time budget"
    mkdir -p "$out/db" && cp .tune/db/*.json .tune/db/specs.txt "$out/db/"
    ;;
  tunebench)  # tune (as `tune`), then ship and benchmark in the same call; database and shipped records in $out/tuned.tgz
    CASES="${CASES:-}" bash "$0" tune "$2" "$3"; rm -rf "$out/db"
    python3 bench/ship_schedules.py schedules/nvidia-h200-sm_90 .tune/db --gpu "NVIDIA H200" --arch sm_90 \
      && tar czf "$out/tuned.tgz" .tune/db/*.json .tune/db/specs.txt schedules/nvidia-h200-sm_90
    timeout 280 python3 bench/bench_fused.py --config default --config tuned \
      --json "$out/fused_h200.json" 2>&1 | tee "$out/fused_h200.txt" | grep -v "^\s*$"
    ;;
  bench)
    python3 bench/ship_schedules.py schedules/nvidia-h200-sm_90 .tune/db --gpu "NVIDIA H200" --arch sm_90 \
      && mkdir -p "$out/shipped" && cp schedules/*-sm_90/* "$out/shipped/"
    timeout 280 python3 bench/bench_fused.py --config default --config tuned \
      --json "$out/fused_h200.json" 2>&1 | tee "$out/fused_h200.txt" | grep -v "^\s*$"
    timeout 120 python3 bench/bench_model.py --target cuda --dtype float16 --json "$out/model_h200.json" 2>&1 | tee "$out/model_h200.txt" | tail -15
    ;;
  tests)  # the kernel's GPU tests (~80 builds: most of a 10-minute call); failures one line each
    timeout 570 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_kernel.py > "$out/gpu_tests_kernel.log" 2>&1
    tail -30 "$out/gpu_tests_kernel.log"
    ;;
  alltests)  # every GPU test in 8 processes: pytest-xdist's wheels carried in .devcarry/xdist (the machine has no registry)
    ls .devcarry/xdist/*.whl >/dev/null 2>&1 || { echo "no wheels in .devcarry/xdist: run 'pip download -d .devcarry/xdist pytest-xdist execnet' here and carry it"; exit 1; }
    mkdir -p /tmp/xdist && for w in .devcarry/xdist/*.whl; do python3 -m zipfile -e "$w" /tmp/xdist; done
    PYTHONPATH="/tmp/xdist:$PYTHONPATH" timeout 570 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider -n 8 tests \
      > "$out/gpu_tests_all.log" 2>&1
    tail -30 "$out/gpu_tests_all.log"
    ;;
  tests2)  # every other GPU test (ONNX models on CUDA, tuning, shipped records)
    timeout 570 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests --deselect tests/test_cuda_kernel.py \
      > "$out/gpu_tests_other.log" 2>&1
    tail -30 "$out/gpu_tests_other.log"
    ;;
  compare)  # default and tuned vs the given configs, on $CASE (default N=32 56x56 64->64->128)
    shift; cfgs=(); for c in "$@"; do cfgs+=(--config "$c"); done
    timeout 330 python3 bench/bench_fused.py --case "${CASE:-$N32}" --config default --config tuned "${cfgs[@]}" \
      --json "$out/fused_compare${TAG:-}.json" 2>&1 | tee "$out/fused_compare${TAG:-}.txt" | grep -v "^\s*$"
    ;;
  epilogue)  # the register epilogues (epilogue=1 and 2): GPU tests, then speed vs the staged form and other tiles
    export T="m_tile=128,warps_m=2,warps_n=2,k_tile=64,n1_tile=64,n2_tile=64,pipeline=1,mma=1"
    W="m_tile=256,warps_m=4,warps_n=1,k_tile=64,n1_tile=64,n2_tile=32,pipeline=1,mma=1"
    timeout 240 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_kernel.py -k register_epilogue \
      > "$out/gpu_tests_epilogue.log" 2>&1; tail -5 "$out/gpu_tests_epilogue.log"
    S="m_tile=64,warps_m=2,warps_n=2,k_tile=64,n1_tile=64,n2_tile=64,pipeline=1,mma=1"
    B="m_tile=128,warps_m=2,warps_n=1,k_tile=64,n1_tile=64,n2_tile=64,pipeline=1,mma=1"  # 64x64 warp tiles
    bash "$0" compare "$T,epilogue=2" "$W,epilogue=2" "$S" "$S,epilogue=2" "$B,epilogue=2" "$T,epilogue=2,pipeline=2"
    bash "$0" ncu "$T,epilogue=2"
    ;;
  halo)  # the halo-tile experiment, checked against numpy, each against the template with the same tiles (~8 min): stage 1
         # (x -> mid), then the whole op at N=32 56x56 64->64->128 and 64->64->256 +r: 128-pixel tiles with epilogue 2 (and 0
         # for 64->64->128), 64-pixel tiles with epilogue 2 (their smaller halo tile may keep 3 blocks per SM)
    E="k_tile=64,pipeline=1,mma=1"
    timeout 120 python3 bench/experiments/halo_tile.py --case "n=32,h=56,w=56,c=64,k1=64,k2=128,dtype=float16" \
      --config "m_tile=128,$E,epilogue=2" 2>&1 | tail -3 | tee -a "$out/halo_stage1.txt"
    for run in "k2=128 m_tile=128,$E,epilogue=2" "k2=256,residual=1 m_tile=128,$E,epilogue=2" "k2=128 m_tile=128,$E,epilogue=0" \
               "k2=128 m_tile=64,$E,epilogue=2" "k2=256,residual=1 m_tile=64,$E,epilogue=2"; do
      set -- $run
      timeout 130 python3 bench/experiments/halo_tile.py --fused --case "n=32,h=56,w=56,c=64,k1=64,$1,dtype=float16" \
        --config "$2" 2>&1 | tail -3 | tee -a "$out/halo_fused.txt"
    done
    ;;
  hopper)
    timeout 320 python3 -m pytest -m gpu -q -rf --tb=short -p no:cacheprovider tests/test_cuda_hopper_conv.py \
      tests/test_cuda_hopper_pair.py "tests/test_real_models.py::test_resnet50_on_hopper_kernels_matches_onnxruntime" 2>&1 \
      | tee "$out/gpu_tests_hopper.log" | tail -8
    timeout 250 python3 bench/experiments/hopper_conv1x1.py ${CASES:+$(printf -- '--spec %s ' $CASES)} 2>&1 | tee "$out/hopper_conv1x1.txt" \
      | grep -v "^\s*$"
    ;;
  hopperpairs)  # bench_fused's dense pairs (N=32 56x56 sweep, ResNet-50's +residual pairs at N=1 and 32), fused on TMA + wgmma,
                # then on the mma.sync template; each run's unfused row is the template's two kernels, torch's row cuDNN
    for on in 1 0; do
      TVM_B2B_HOPPER_PAIR=$([ $on = 1 ] && echo all || echo 0) timeout 280 python3 bench/bench_fused.py --config default \
        $(dense_pair_cases) \
        --json "$out/fused_h200_hopper$on.json" 2>&1 | tee "$out/fused_h200_hopper$on.txt" | grep -v "^\s*$" | tail -20
    done
    ;;
  hopperab)  # the Hopper pair's dense cases (hopperpairs') with its default config on a baseline tree (BASE: a folder holding an
              # earlier commit's tvm_b2b/ and bench/bench_fused.py, e.g. `git archive HEAD~1 tvm_b2b bench/bench_fused.py | tar -x -C
              # .devcarry/base`, carried), then on this tree with the default and each CFG, and the two convs (singles)
    cases="$(dense_pair_cases)"
    for tree in "${BASE:?a baseline tree}" .; do
      tag=$([ "$tree" = . ] && echo new || echo base)
      cfgs=(--config default); [ "$tree" = . ] && cfgs+=(--singles $(printf -- '--config %s ' "${@:2}"))  # singles: the two convs
      TVM_B2B_HOPPER_PAIR=all timeout "${LIMIT:-250}" python3 "$tree/bench/bench_fused.py" $cases "${cfgs[@]}" \
        --json "$out/fused_hopperab_$tag.json" 2>&1 | tee "$out/fused_hopperab_$tag.txt" | grep -v "^\s*$" | cut -c1-170
    done
    ;;
  singles)  # the dense pairs fused on the mma.sync template against their two convs as a model runs them unfused (singles:
             # on sm_90 the 3x3 on TMA + wgmma where that rule takes it); ResNet-50's 56x56 pair at N=1, 8, 32, the N=32 sweep
    TVM_B2B_HOPPER_PAIR=0 timeout 290 python3 bench/bench_fused.py --singles --config default \
      $(for n in 1 8 32; do printf -- "--case n=$n,h=56,w=56,c=64,k1=64,k2=256,residual=1,dtype=float16 "; done) \
      $(for k2 in 64 128 256; do printf -- "--case n=32,h=56,w=56,c=64,k1=64,k2=$k2,dtype=float16 "; done) \
      --json "$out/fused_singles.json" 2>&1 | tee "$out/fused_singles.txt" | grep -v "^\s*$" | cut -c1-170
    ;;
  hopperexp)  # the s25 profile's first experiment in one call (~4 min): the pair's GPU tests (one producer warp's included),
              # one producer warp against a warpgroup (envab)
    timeout 150 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_hopper_pair.py 2>&1 | tail -4
    ENVS="TVM_B2B_HOPPER_PRODUCER=warpgroup TVM_B2B_HOPPER_PRODUCER=warp" LIMIT=110 bash "$0" envab
    ;;
  hoppertune)  # the written kernels' tuning (tune.written) on the dense N=32 pairs (dense_pair_cases): TRIALS configs each
              # (default 8: the default and the configs one knob away) into .tune/db for at most MIN minutes (resumes; the
              # database copied out), then bench_fused's default against tuned on it, numpy-checked (~9 min in all)
    TVM_B2B_HOPPER_PAIR=all timeout $(( ${2:-5} * 60 + 60 )) python3 -m tvm_b2b tune $(dense_pair_cases | sed 's/--case/--spec/g') \
      --target cuda --trials "${TRIALS:-8}" --db .tune/db --minutes "${2:-5}" 2>&1 | quiet | tee "$out/hoppertune.log" | grep -v "^\s*$"
    mkdir -p "$out/db" && cp .tune/db/*.json .tune/db/specs.txt "$out/db/"
    TVM_B2B_HOPPER_PAIR=all timeout "${LIMIT:-200}" python3 bench/bench_fused.py --config default --config tuned --db .tune/db \
      $(dense_pair_cases) --json "$out/fused_hoppertune.json" 2>&1 | tee "$out/fused_hoppertune.txt" | grep -v "^\s*$" | cut -c1-170
    ;;
  clustertune)  # the Hopper pair's cluster form (cs > 1) on ResNet-50's batch-32 pairs of k1 >= 256 (CASES, else cluster_pair_cases):
                # their GPU tests vs numpy, then the default config and clusters of 2, 4 and 8 against the two convs, numpy-
                # checked; with MIN > 0 also TRIALS configs each tuned (default 10) for at most MIN minutes, default vs tuned
    timeout 200 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_hopper_pair.py -k "numpy" \
      2>&1 | tee "$out/gpu_tests_hopper_pair.log" | tail -8
    cases=${CASES:-$(cluster_pair_cases)}
    TVM_B2B_HOPPER_PAIR=all timeout "${LIMIT:-300}" python3 bench/bench_fused.py --singles --config default \
      --config bm=64,bn=128,stages=3,cs=2 --config bm=64,bn=128,stages=4,warp=1,cs=4 --config bm=64,bn=128,stages=4,warp=1,cs=8 \
      $cases --json "$out/fused_cluster.json" 2>&1 | tee "$out/fused_cluster.txt" | grep -v "^\s*$" | cut -c1-170
    if [ "${2:-0}" -gt 0 ]; then
      TVM_B2B_HOPPER_PAIR=all timeout $(( $2 * 60 + 60 )) python3 -m tvm_b2b tune ${cases//--case/--spec} --target cuda \
        --trials "${TRIALS:-10}" --db .tune/db --minutes "$2" 2>&1 | quiet | tee "$out/clustertune.log" | grep -v "^\s*$" | tail -40
      mkdir -p "$out/db" && cp .tune/db/*.json .tune/db/specs.txt "$out/db/"
      TVM_B2B_HOPPER_PAIR=all timeout "${LIMIT:-200}" python3 bench/bench_fused.py --config default --config tuned --db .tune/db \
        $cases --json "$out/fused_clustertune.json" 2>&1 | tee "$out/fused_clustertune.txt" | grep -v "^\s*$" | cut -c1-170
    fi
    ;;
  pairdeep)  # the Hopper pair's pipeline depth (Nsight Compute, bench/results/ncu_hopper_pair_h100_s25_*.txt: latency-bound,
             # long-scoreboard stalls, 3 buffers): the dense N=32 56x56 pairs and 28x28 +r with the default config and each of
             # CFGS (default: the halo form's w ring 4-8 deep, which 2 blocks per SM still hold, and 64-pixel tiles)
    P="${CFGS:-bm=128,bn=64,stages=4,halo=1 bm=128,bn=64,stages=6,halo=1 bm=128,bn=64,stages=8,halo=1 bm=64,bn=64,stages=6}"
    tag="${TVM_B2B_HOPPER_PRODUCER:+_$TVM_B2B_HOPPER_PRODUCER}"  # (the producer's form, where set, names the files)
    TVM_B2B_HOPPER_PAIR=all timeout "${LIMIT:-280}" python3 bench/bench_fused.py --config default $(printf -- '--config %s ' $P) \
      $(dense_pair_cases | sed 's/--case n=32,h=14[^ ]*//') --json "$out/fused_pairdeep$tag.json" 2>&1 | tee "$out/fused_pairdeep$tag.txt" \
      | grep -v "^\s*$" | cut -c1-170
    ;;
  hoppersweep)  # configs of the Hopper kernels: the pairs (TVM_B2B_HOPPER_PAIR=all; singles = the two convs as the model runs
                # them unfused) and ResNet-50's batch-32 convs (TVM_B2B_HOPPER=all); 2-stage configs fit 2 blocks per SM
    P="bm=128,bn=128,stages=2 bm=128,bn=64,stages=3 bm=64,bn=128,stages=4 bm=64,bn=64,stages=4"
    TVM_B2B_HOPPER_PAIR=all timeout 290 python3 bench/bench_fused.py --singles --config default $(printf -- '--config %s ' $P) \
      $(dense_pair_cases) \
      --json "$out/fused_hopper_sweep.json" 2>&1 | tee "$out/fused_hopper_sweep.txt" | grep -v "^\s*$" | cut -c1-170
    C="bm=128,bn=128,stages=2 bm=128,bn=256,stages=2 bm=64,bn=128,stages=3 bm=64,bn=64,stages=4"
    TVM_B2B_HOPPER=all timeout 290 python3 bench/bench_convs.py --batch 32 \
      --config default $(printf -- '--config %s ' $C) --json "$out/convs_hopper_sweep.json" 2>&1 | tee "$out/convs_hopper_sweep.txt" \
      | grep -v "^\s*$" | cut -c1-170
    ;;
  hopperconvs)  # bench_convs' ResNet-50 convs (batch 32 and 1), default configs, on TMA + wgmma and then on the mma.sync template
    for on in 1 0; do
      TVM_B2B_HOPPER=$([ $on = 1 ] && echo all || echo 0) timeout "${LIMIT:-280}" python3 bench/bench_convs.py --config default --json "$out/convs_hopper$on.json" 2>&1 \
        | tee "$out/convs_hopper$on.txt" | grep -v "^\s*$" | grep -v "^  best" | cut -c1-170
    done
    ;;
  grouped)
    timeout 300 python3 -m pytest -m gpu -q -rf --tb=short -p no:cacheprovider tests/test_grouped.py -k "cuda and conv" 2>&1 \
      | tee "$out/gpu_tests_grouped.log" | tail -5
    resnext="h=56,w=56,c=128,k=128 h=56,w=56,c=256,k=256,stride=2 h=28,w=28,c=256,k=256 h=28,w=28,c=512,k=512,stride=2
             h=14,w=14,c=512,k=512 h=14,w=14,c=1024,k=1024,stride=2 h=7,w=7,c=1024,k=1024"
    specs=(); for n in 1 32; do for s in $resnext; do specs+=(--spec "n=$n,$s,kh=3,kw=3,pad_h=1,pad_w=1,groups=32"); done; done
    for mode in ${MODES:-0 all}; do
      TVM_B2B_GROUPED_TC=$mode timeout 280 python3 bench/bench_convs.py "${specs[@]}" --config default \
        --json "$out/convs_grouped_tc$mode.json" 2>&1 | tee "$out/convs_grouped_tc$mode.txt" | grep -E "us |WRONG|rror"
    done
    ;;
  dwpairs)  # MobileNetV2's depthwise pairs at each batch of NS (default 1), for each TVM_B2B_DW_STAGED of MODES (default "0 1"):
    # the grouped pairs' GPU tests (TESTS=0: not), then bench_fused with the default config and each CFG given
    shift; cfgs=(--config default); for c in "$@"; do cfgs+=(--config "$c"); done
    for mode in ${MODES:-0 1}; do
      export TVM_B2B_DW_STAGED=$mode TVM_B2B_DW_CLUSTER=0  # the template (sm_90's cluster kernel would take some pairs)
      [ "${TESTS:-1}" = 1 ] && timeout "${TEST_LIMIT:-100}" python3 -m pytest -m gpu -q -rf --tb=short -p no:cacheprovider \
        tests/test_grouped.py -k "cuda and pair" 2>&1 | tee "$out/gpu_tests_dwpairs_staged$mode.log" | tail -4
      for n in ${NS:-1}; do
        dw_bench "$n" "fused_dw_n${n}_staged$mode"
      done
    done
    ;;
  dwcluster)  # MobileNetV2's depthwise pairs at each batch of NS (default 1) on the cluster kernel (cuda_cluster_dw_pair: its
    # default config and each CFG) beside the template's fused kernel, our two kernels and cuDNN, one run a batch; its GPU tests first
    shift; cfgs=(--config "TVM_B2B_DW_CLUSTER=all:default" --config "TVM_B2B_DW_CLUSTER=0:default")
    for c in "$@"; do cfgs+=(--config "TVM_B2B_DW_CLUSTER=all:$c"); done
    [ "${TESTS:-1}" = 1 ] && timeout "${TEST_LIMIT:-150}" python3 -m pytest -m gpu -q -rf --tb=short -p no:cacheprovider \
      tests/test_cuda_cluster_dw_pair.py 2>&1 | tee "$out/gpu_tests_dwcluster.log" | tail -4
    for n in ${NS:-1}; do
      dw_bench "$n" "fused_dwcluster_n${n}"
    done
    ;;
  groupede2e)
    for mode in ${MODES:-"" 0}; do
      TVM_B2B_GROUPED_TC=$mode timeout 290 python3 bench/bench_e2e.py --models "$2" --torch-compile none --breakdown \
        --out "$out/e2e_h200_grouped_tc$mode" 2>&1 | grep -v "^\s*$" | tail -25
    done
    ;;
  dwclustere2e)  # bench_e2e with TVM_B2B_DW_CLUSTER of each of MODES (default "all 0": every depthwise pair on the cluster kernel, then
    # none), on the shipped records
    MODES="${MODES:-all 0}" switch_e2e TVM_B2B_DW_CLUSTER dwcluster "$2"
    ;;
  envab)  # the Hopper pair's dense cases (hopperab's) with the default config on BASE's tree (if given), then on this tree
           # under each assignment of ENVS (e.g. ENVS="TVM_B2B_PAIR_AHEAD=0 TVM_B2B_PAIR_AHEAD=1"): one call, one GPU
    cases="$(dense_pair_cases)"
    for run in ${BASE:+base} ${ENVS:-default}; do
      tree=$([ "$run" = base ] && echo "$BASE" || echo .)
      env $([ "$run" = base ] || [ "$run" = default ] || echo "$run") TVM_B2B_HOPPER_PAIR=all timeout "${LIMIT:-150}" \
        python3 "$tree/bench/bench_fused.py" $cases --config default --json "$out/fused_envab_${run//[=]/_}.json" 2>&1 \
        | tee "$out/fused_envab_${run//[=]/_}.txt" | grep -v "^\s*$" | cut -c1-170
    done
    ;;
  pairse2e)  # bench_e2e with TVM_B2B_HOPPER_PAIR of each of MODES (default "1 0": the dense pairs fused on TMA + wgmma where its
              # policy takes them, then on the mma.sync template or as two convs, as before), on the shipped records
    MODES="${MODES:-1 0}" switch_e2e TVM_B2B_HOPPER_PAIR hopperpair "$2"
    ;;
  hoppere2e)
    for on in 1 0; do
      TVM_B2B_HOPPER=$on timeout 280 python3 bench/bench_e2e.py --models "$2" --torch-compile none --breakdown \
        --out "$out/e2e_h200_hopper$on" 2>&1 | grep -v "^\s*$" | tail -25
    done
    ;;
  ncu)
    shift
    sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
    for cfg in tuned "$@"; do
      flag=$([ "$cfg" = tuned ] && echo --tuned || echo "--config $cfg")
      timeout 100 ncu --clock-control none -k "regex:${KERNEL:-fused}" --launch-skip 1 --launch-count 1 $sections \
        python3 bench/profile_kernel.py --case "${CASE:-$N32}" $flag --source "$out/kernel_${cfg//[=,]/_}.cu" > "$out/ncu_${cfg//[=,]/_}.txt" 2>&1
      echo "== $cfg"; grep -E "config |Duration|Throughput|Hit Rate|Achieved Occupancy|Registers Per|Shared Memory Config|Dynamic Shared|Block Limit|Warp Cycles Per Issued|stalled_|Issue Slots Busy|Executed Ipc A|One or More|No Eligible|^ *(OPT|WRN)" "$out/ncu_${cfg//[=,]/_}.txt" | head -40
    done
    ;;
  hopperncu)  # Nsight Compute of the Hopper pair's default config on each of CASES (default: issue 17's three N=32 56x56
              # targets, 64->64->256 +r first), with the scheduler and instruction sections; then the kernel's CUDA source
    sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy --section LaunchStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
    i=0
    for case in ${CASES:-n=32,h=56,w=56,c=64,k1=64,k2=256,residual=1 n=32,h=56,w=56,c=64,k1=64,k2=128 n=32,h=56,w=56,c=64,k1=64,k2=256}; do
      i=$((i + 1))
      TVM_B2B_HOPPER_PAIR=all timeout 120 ncu --clock-control none -k "regex:${KERNEL:-wgmma}" --launch-skip 1 --launch-count 1 \
        $sections python3 bench/profile_kernel.py --case "$case,dtype=float16" --source "$out/kernel_$i.cu" > "$out/ncu_$i.txt" 2>&1
      echo "== $case"; grep -E "config |Duration|Throughput|Hit Rate|Achieved Occupancy|Registers Per|Dynamic Shared|Block Limit|Warp Cycles Per Issued|stalled_|Issue Slots Busy|Executed Ipc A|One or More|No Eligible|Bank|Pipe|^ *(OPT|WRN)" "$out/ncu_$i.txt" | cut -c1-150 | head -60
    done
    ;;
  sourcencu)  # Nsight Compute's warp-state sampling per SASS instruction (bench/ncu_source.py) of each of CASES' kernel (SPEC or
              # SPEC@CONFIG; default: ResNet-50's slowest convs against their rooflines at batch 32, default and persistent, and a
              # 3x3), default configs, on TMA + wgmma; the persistent grid's GPU tests first
    timeout 150 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_hopper_conv.py -k "persist" 2>&1 | tail -4
    i=0
    for case in ${CASES:-n=32,h=56,w=56,c=256,k=128 n=32,h=56,w=56,c=256,k=128@bm=128,bn=128,stages=4,persist=1 n=32,h=56,w=56,c=64,k=256 n=32,h=56,w=56,c=64,k=256@bm=128,bn=256,stages=4,persist=1 n=32,h=7,w=7,c=512,k=512,kh=3,kw=3,pad_h=1,pad_w=1}; do
      i=$((i + 1)); spec="${case%@*}"; cfg=$([ "$spec" = "$case" ] || echo "--config ${case#*@}")
      TVM_B2B_HOPPER=all TVM_B2B_HOPPER_PAIR=all timeout 150 ncu --clock-control none -k "regex:${KERNEL:-wgmma}" --launch-skip 1 \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters -f -o "$out/src_$i" \
        python3 bench/profile_kernel.py --case "$spec,dtype=float16" $cfg > "$out/src_$i.log" 2>&1
      ncu -i "$out/src_$i.ncu-rep" --page source --csv --print-source sass > "$out/src_$i.csv" 2>&1
      ncu -i "$out/src_$i.ncu-rep" --page details --section SpeedOfLight 2>&1 | grep -E "Duration|Throughput" >> "$out/src_$i.log"
      rm -f "$out/src_$i.ncu-rep"  # (what comes back from the machine is limited in count; the CSV holds the samples)
      echo "== $case"; grep -E "Duration|kernels|rror" "$out/src_$i.log" | head -4
      python3 bench/ncu_source.py "$out/src_$i.csv" --top 25 2>&1 | cut -c1-200
    done
    ;;
  persistab)  # the Hopper conv's persistent grid (persist=1): its GPU tests (the subsampled 1x1's and narrow convs' too), then ResNet-50's unfused
              # batch-32 convs (CASES: bench_convs --spec flags, else unfused_resnet50_convs) with each of MODES (default "mma 0 1"):
              # mma = the mma.sync kernel (TVM_B2B_HOPPER=0), else TMA + wgmma (=all) with TVM_B2B_HOPPER_PERSIST=MODE, or sb =
              # TMA + wgmma with TVM_B2B_HOPPER_SB=shared; default configs
    if [ "${TESTS:-1}" = 1 ]; then
      timeout 200 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_hopper_conv.py -k "persist or stride or None" \
        2>&1 | tail -4
      timeout 100 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_hopper_pair.py -k switches \
        2>&1 | tail -4
    fi
    for mode in ${MODES:-mma 0 1}; do
      hopper=$([ "$mode" = mma ] && echo 0 || echo all) persist=$([ "$mode" = 1 ] && echo 1 || echo 0)
      sb=$([ "$mode" = sb ] && echo shared || echo global)
      TVM_B2B_HOPPER=$hopper TVM_B2B_HOPPER_PERSIST=$persist TVM_B2B_HOPPER_SB=$sb timeout "${LIMIT:-200}" python3 bench/bench_convs.py \
        ${CASES:-$(unfused_resnet50_convs)} --config default --json "$out/convs_persist$mode.json" 2>&1 \
        | tee "$out/convs_persist$mode.txt" | grep -v "^\s*$" \
        | grep -v "^  best" | sed 's/,kh=1,kw=1,stride=1,pad_h=0,pad_w=0//; s/,dtype=float16//' | cut -c1-150
    done
    ;;
  pairpersist)  # the Hopper pair's persistent form (persist=1): GPU tests vs numpy, then the pairs' default config against
                # it (TVM_B2B_HOPPER_PERSIST=1 on the default) and the two convs (singles: the convs' defaults, persistent by
                # their rule), numpy-checked (~4 min)
    timeout 200 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_hopper_pair.py -k "persist" 2>&1 | tail -4
    TVM_B2B_HOPPER_PAIR=all timeout "${LIMIT:-300}" python3 bench/bench_fused.py $(dense_pair_cases) \
      --case n=32,h=56,w=56,c=128,k1=128,k2=512,stride=2,residual=1,dtype=float16 \
      --case n=32,h=28,w=28,c=256,k1=256,k2=1024,stride=2,residual=1,dtype=float16 \
      --singles --config default --config TVM_B2B_HOPPER_PERSIST=1:default --json "$out/fused_pairpersist.json" 2>&1 \
      | tee "$out/fused_pairpersist.txt" | grep -v "^\s*$" | cut -c1-170
    ;;
  enve2e)  # bench_e2e with the switch VAR (default TVM_B2B_HOPPER_PERSIST) at each of MODES (default "1 0"), the rest as shipped
    var=${VAR:-TVM_B2B_HOPPER_PERSIST}
    MODES="${MODES:-1 0}" switch_e2e "$var" "${var#TVM_B2B_}" "$2"
    ;;
  tmaoverlap)  # does TMA take a tensor map whose rows overlap (bench/experiments/tma_overlap.cu: the stem as 128-byte rows of 4
               # pixels x 16 channels)? a few seconds
    nvcc -arch=sm_90a -o /tmp/tma_overlap bench/experiments/tma_overlap.cu -lcuda && /tmp/tma_overlap
    ;;
  tunemodels)  # the models one after another until MIN minutes are spent (a rerun continues where it stopped)
    minutes="$2"; shift 2; end=$(( $(date +%s) + minutes * 60 )); mkdir -p .tune/models
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
    for model in "$@"; do
      name="${model%%:*}" batch="${model##*:}"
      left=$(( (end - $(date +%s)) / 60 )); [ "$left" -ge 1 ] || { echo "time spent: $model not tuned"; continue; }
      path=$(python3 -c "import sys; sys.path.insert(0, 'onnx_models'); from torchvision_models import export; print(export('$name', $batch, 224, '.tune/models'))")
      timeout $(( left * 60 + 120 )) python3 -m tvm_b2b tune --model "$path" ${ONLY:+--only "$ONLY"} --target cuda --trials "${TRIALS:-16}" --db .tune/db \
        --minutes "$left" 2>&1 | quiet | tee -a "$out/tune_models.log" | grep -E "^n=|distinct|time budget|short|without"
    done
    mkdir -p "$out/db" && cp .tune/db/*.json .tune/db/specs.txt "$out/db/"
    ;;
  shipe2e)
    rm -rf .tune/schedules && mkdir -p .tune/schedules && cp -r schedules/nvidia-h200-sm_90 .tune/schedules/
    TVM_B2B_SCHEDULES=.tune/schedules python3 bench/ship_schedules.py .tune/schedules/nvidia-h200-sm_90 .tune/db \
      && cp -r .tune/schedules/nvidia-h200-sm_90 "$out/shipped"
    TVM_B2B_SCHEDULES=$PWD/.tune/schedules timeout 560 python3 bench/bench_e2e.py --models "$2" --torch-compile "${3:-none}" \
      --breakdown --out "$out/e2e_h200" 2>&1 | grep -v "^\s*$" | tail -60
    ;;
  convs)
    shift; cfgs=(--config default); for c in "$@"; do cfgs+=(--config "$c"); done; specs=()
    for c in ${CASES:-}; do specs+=(--spec "$c"); done
    TVM_B2B_HOPPER=${TVM_B2B_HOPPER:-0} timeout "${LIMIT:-300}" python3 bench/bench_convs.py "${specs[@]}" "${cfgs[@]}" --json "$out/convs${TAG:-}.json" 2>&1 \
      | tee "$out/convs${TAG:-}.txt" | grep -v "^\s*$"
    ;;
  splitk)  # the mma.sync kernel's split-K factors on deep convs of few blocks (~3 min)
    timeout "${LIMIT:-400}" python3 bench/experiments/split_k.py --json "$out/split_k.json" 2>&1 | grep -v "^\s*$" \
      | tee "$out/split_k.txt" | cut -c1-220
    ;;
  dilated)  # dilated convs and pairs on TMA + wgmma (taps' form) against the mma.sync kernels, numpy-checked
    timeout 200 python3 -m pytest -m gpu -q -rf --tb=line -p no:cacheprovider tests/test_cuda_hopper_conv.py \
      tests/test_cuda_hopper_pair.py -k "dilation" 2>&1 | tail -4
    for n in ${NS:-8 32}; do
      specs=""
      for s in h=28,w=28,c=256,k=256,kh=3,kw=3,pad_h=2,pad_w=2,dilation=2 h=28,w=28,c=512,k=512,kh=3,kw=3,pad_h=4,pad_w=4,dilation=4 \
               h=28,w=28,c=2048,k=256,kh=3,kw=3,pad_h=12,pad_w=12,dilation=12; do specs="$specs --spec n=$n,$s,dtype=float16"; done
      for mode in 0 all; do
        TVM_B2B_HOPPER=$mode timeout "${LIMIT:-200}" python3 bench/bench_convs.py $specs --config default \
          --json "$out/convs_dilated_n${n}_$mode.json" 2>&1 | grep -v "^\s*$" | tee "$out/convs_dilated_n${n}_$mode.txt" | cut -c1-170
      done
      timeout "${LIMIT:-200}" python3 bench/bench_fused.py --case n=$n,h=28,w=28,c=256,k1=256,k2=1024,dilation=2,residual=1,dtype=float16 \
        --case n=$n,h=28,w=28,c=512,k1=512,k2=2048,dilation=4,residual=1,dtype=float16 --singles \
        --config TVM_B2B_HOPPER_PAIR=0:default --config TVM_B2B_HOPPER_PAIR=all:default \
        --json "$out/fused_dilated_n$n.json" 2>&1 | grep -v "^\s*$" | tee "$out/fused_dilated_n$n.txt" | cut -c1-170
    done
    ;;
  legalized)
    timeout 120 python3 bench/bench_legalized.py --json "$out/legalized.json" 2>&1 | tee "$out/legalized.txt" | tail -6
    ;;
  rpc)
    timeout 400 python3 -m pytest -m gpu -q -rf --tb=short -p no:cacheprovider tests/test_rpc.py > "$out/gpu_tests_rpc.log" 2>&1
    tail -30 "$out/gpu_tests_rpc.log"
    ;;
  model)
    timeout 130 python3 bench/bench_model.py --target cuda --dtype float16 --json "$out/model_h200.json" 2>&1 | tee "$out/model_h200.txt" | tail -8
    timeout 260 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_frontend.py tests/test_tune.py 2>&1 | tail -15 | tee "$out/gpu_tests_frontend_tune.log"
    ;;
esac
