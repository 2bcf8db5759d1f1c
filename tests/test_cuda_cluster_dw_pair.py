"""schedule/cuda_cluster_dw_pair.py: the depthwise pair on sm_90, k1 split over a thread-block cluster and reduced
through distributed shared memory. CPU: which pairs and configs it takes and why not, its kernel's launch as a cluster,
its instructions and an nvcc sm_90a compile. GPU (sm_90 only): the kernel vs numpy (op.TOLERANCES: float16
|y - ref| <= 1e-2 + 1e-2 |ref|), one kernel. What it measures: `bash bench/gpu_session.sh dwcluster`."""
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuda_source import compiles_for_sm90a, kernels, skip_unless_sm90
from tvm_b2b import FusedConvSpec, build
from tvm_b2b.op.reference import compare, random_inputs, reference
from tvm_b2b.schedule import plan, rule_for
from tvm_b2b.schedule import cuda_cluster_dw_pair as cluster
from tvm_b2b.target import parse_target, target_info

SM90, SM80 = parse_target("cuda:sm_90"), parse_target("cuda:sm_80")


def depthwise(text: str) -> FusedConvSpec:
    """A depthwise pair as MobileNetV2's (relu6, projection without activation) unless the text says otherwise."""
    spec = FusedConvSpec.parse(f"act1=relu6,act2=none,dtype=float16,{text}")
    return dataclasses.replace(spec, groups=spec.c)


# MobileNetV2's 14x14 and 7x7 pairs (the template's losses), with a residual, k2 = 320 in one block (10 n8 tiles a
# warp), a stride-2 3x3 on odd sizes with k2 = 24 (3 n8 tiles: a warp with none), a cluster of 1, relu/relu / relu6 act2
CASES = [("n=1,h=14,w=14,c=384,k1=384,k2=64,residual=1", "bm=16,cs=8"),
         ("n=2,h=7,w=7,c=960,k1=960,k2=320", None),
         ("n=3,h=9,w=11,c=48,k1=48,k2=24,stride=2", "bm=32,cs=3"),
         ("n=4,h=28,w=28,c=192,k1=192,k2=64,stride=2", "bm=64,cs=6"),
         ("n=1,h=5,w=6,c=32,k1=32,k2=16,act1=relu,act2=relu,residual=1", "bm=16,cs=1"),
         ("n=2,h=14,w=14,c=576,k1=576,k2=96,act2=relu6,residual=1", "bm=32,cs=6"),
         ("n=1,h=7,w=7,c=960,k1=960,k2=160,residual=1", "bm=16,cs=15"),  # a non-portable cluster (sm_90: up to 16)
         # the slice in steps (double-buffered mid and w2): 6 steps, 8 warps, no cluster; 5 steps of a cluster of 2;
         # 3 steps (an odd count) with 3 n8 tiles over 8 warps
         ("n=4,h=14,w=14,c=384,k1=384,k2=64,residual=1", "bm=64,cs=1,kc=64,warps=8"),
         ("n=2,h=7,w=7,c=960,k1=960,k2=160,residual=1", "bm=32,cs=2,kc=96"),
         ("n=3,h=9,w=11,c=48,k1=48,k2=24,stride=2", "bm=16,cs=1,kc=16,warps=8")]


@pytest.fixture
def cluster_on(monkeypatch):
    monkeypatch.setenv(cluster.ENABLE_ENV, "all")


@pytest.mark.parametrize("case,why", [("n=1,h=8,w=8,c=64,k1=64,k2=64", "depthwise pairs only"),
                                      ("n=1,h=8,w=8,c=40,k1=40,k2=64", "k1 a multiple of 16"),
                                      ("n=1,h=8,w=8,c=64,k1=64,k2=20", "k2 of 8"),
                                      ("n=1,h=8,w=8,c=64,k1=64,k2=800", "accumulators")])
def test_rule_refuses_what_it_does_not_compute(cluster_on, case, why):
    """A dense pair, k1 without 16-channel slices, k2 not in n8 tiles or too wide for one block's accumulators: a reason,
    and the template's rule takes the pair."""
    spec = depthwise(case)
    if "depthwise" in why:
        spec = dataclasses.replace(spec, groups=1)
    assert why in cluster.RULE.can_implement(spec, target_info(SM90))
    assert rule_for(SM90, "conv3x3_conv1x1", spec).name != cluster.RULE.name
    with pytest.raises(ValueError, match=why):
        cluster.pair_func(spec, cluster.ClusterConfig(bm=16, cs=1))


def test_rule_takes_the_pairs_where_it_measured_faster(monkeypatch):
    """On by default on sm_90 where it measured faster (batch 1 from 56x56 down, k1 < 960), the pair then one kernel
    whatever the template's fusion policy says of it; elsewhere the template's rule and policy, with the reason; off with
    TVM_B2B_DW_CLUSTER=0, everywhere it computes with =all; clusters need sm_90; the two-kernel form is the template's."""
    small = depthwise("n=1,h=14,w=14,c=384,k1=384,k2=64,residual=1")
    monkeypatch.delenv(cluster.ENABLE_ENV, raising=False)
    planned = plan(small, SM90, policy=True)
    assert planned.fused and len(planned.kernels) == 1 and planned.config == cluster.default_config(small)
    assert len(plan(small, SM90, fused=False).kernels) == 2
    for text, why in [("n=32,h=14,w=14,c=384,k1=384,k2=64", "6272 input pixels"), ("n=1,h=7,w=7,c=960,k1=960,k2=160", "k1=960")]:
        assert why in cluster.RULE.can_implement(depthwise(text), target_info(SM90))
        assert rule_for(SM90, "conv3x3_conv1x1", depthwise(text)).name != cluster.RULE.name
    assert "need sm_90" in cluster.RULE.can_implement(small, target_info(SM80))
    monkeypatch.setenv(cluster.ENABLE_ENV, "0")
    assert "off" in cluster.RULE.can_implement(small, target_info(SM90))
    assert not plan(small, SM90, policy=True).fused  # the template's policy: k1 = 384 on 196 pixels stays unfused
    monkeypatch.setenv(cluster.ENABLE_ENV, "all")
    assert plan(depthwise("n=32,h=14,w=14,c=384,k1=384,k2=64"), SM90, policy=True).kernels[0].attrs[cluster.TIRX_ATTR]


@pytest.mark.parametrize("case,config", [("n=1,h=14,w=14,c=384,k1=384,k2=64", cluster.ClusterConfig(bm=16, cs=8)),
                                         ("n=1,h=7,w=7,c=960,k1=960,k2=320", cluster.ClusterConfig(bm=16, cs=6)),
                                         ("n=32,h=28,w=28,c=192,k1=192,k2=64", cluster.ClusterConfig(bm=64, cs=6)),
                                         ("n=32,h=7,w=7,c=960,k1=960,k2=320", cluster.ClusterConfig(bm=32, cs=6))])
def test_default_config(case, config):
    """The largest cluster whose slices are whole mma steps; the largest pixel tile that still makes 2 x 132 blocks
    within the accumulators (k2 = 320: 80 a thread at bm = 32, 160 at 64)."""
    assert cluster.default_config(depthwise(case)) == config


def test_configs_it_cannot_run_say_why():
    spec = depthwise("n=1,h=7,w=7,c=960,k1=960,k2=320")
    assert "does not split" in cluster.config_problem(spec, cluster.ClusterConfig(bm=16, cs=8))
    assert "accumulators" in cluster.config_problem(spec, cluster.ClusterConfig(bm=64, cs=6))
    with pytest.raises(ValueError, match="bm is 16, 32 or 64"):
        cluster.ClusterConfig.parse("bm=48,cs=2")
    with pytest.raises(ValueError, match="cs 1 to 16"):
        cluster.ClusterConfig.parse("bm=16,cs=17")
    assert cluster.config_problem(spec, cluster.ClusterConfig.parse("bm=16,cs=15")) is None  # non-portable: a config's only
    with pytest.raises(ValueError, match="m_tile is not a parameter"):
        cluster.RULE.parse_config("m_tile=32,cs=2")
    assert "does not split into steps of 64" in cluster.config_problem(spec, cluster.ClusterConfig.parse("bm=16,cs=6,kc=64"))
    for text in ("bm=16,cs=2,kc=24", "bm=16,cs=2,warps=2"):
        with pytest.raises(ValueError, match="kc a multiple of 16 .* warps 4 or 8"):
            cluster.ClusterConfig.parse(text)
    assert cluster.ClusterConfig.parse("bm=16,cs=6,kc=32,warps=8").to_string() == "bm=16,cs=6,kc=32,warps=8"


def test_steps_bound_shared_memory():
    """The slice in steps of kc channels: shared memory follows the step (two of mid's and w2's), not the slice, so a
    cluster of 2 on 7x7 k1=960 fits where the whole slice at once does not; 8 warps halve the accumulators."""
    wide = depthwise("n=32,h=7,w=7,c=960,k1=960,k2=320")
    whole, steps = cluster.ClusterConfig(bm=32, cs=2), cluster.ClusterConfig(bm=32, cs=2, kc=96)
    assert "KiB of shared memory" in cluster.config_problem(wide, whole)
    assert cluster.config_problem(wide, steps) is None and cluster.shared_bytes(wide, steps) == 2 * 2 * (32 * 104 + 96 * 328)
    assert cluster.acc_regs(wide, 64, warps=8) == cluster.acc_regs(wide, 64) // 2 == 80
    assert cluster.config_problem(wide, cluster.ClusterConfig(bm=64, cs=2, kc=96, warps=8)) is None


def test_kernel_launches_as_a_cluster():
    """The lowered kernel's launch parameters carry the cluster's extent (clusterCtaIdx.x = cs: the runtime launches it
    with cuLaunchKernelEx's cluster dimension) over a grid of cs x the pixel tiles."""
    import tvm
    from tvm.tirx.compilation_pipeline import tirx_pipeline

    spec, cfg = depthwise("n=1,h=14,w=14,c=384,k1=384,k2=64"), cluster.ClusterConfig(bm=16, cs=8)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
    func = cluster.pair_func(spec, cfg).with_attr("target", target)
    with target:
        lowered = tirx_pipeline()[0](tvm.IRModule({"main": func}))
    device = next(f for gv, f in lowered.functions.items() if gv.name_hint.endswith("_kernel"))
    assert list(device.attrs["tirx.kernel_launch_params"])[:2] == ["clusterCtaIdx.x", "blockIdx.x"]
    launches = str(lowered)
    assert 'T.launch_thread("clusterCtaIdx.x", 8)' in launches and 'T.launch_thread("blockIdx.y", 13)' in launches


@pytest.mark.parametrize("case,config", CASES[:3] + CASES[-2:])
def test_kernel_has_the_cluster_instructions_and_compiles(cluster_on, tmp_path, case, config):
    """One kernel: w2's slice by cp.async, mid through ldmatrix into mma.sync, partial sums read across the cluster
    (mapa, ld.shared::cluster) between two cluster barriers; nvcc compiles it for sm_90a."""
    spec = depthwise(case)
    kernel = build(spec, "cuda:sm_90", config=config, db=None)
    source = kernel.source()
    (params,) = kernels(source).values()
    assert kernel.func_names == ["fused_dw3x3_conv1x1_cluster"] and ("r_ptr" in params) == bool(spec.residual)
    for instruction in ("cp.async.c", "ldmatrix.sync.aligned.m8n8.x4", "ldmatrix.sync.aligned.m8n8.x2.trans",
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "mapa.shared::cluster.u32",
                        "ld.shared::cluster.v4.f32"):
        assert instruction in source, instruction
    body = source[source.index("fused_dw3x3_conv1x1_cluster_kernel(float"):]
    assert body.count("tvm_builtin_cuda_cluster_sync();") == 2 and "barrier.cluster.arrive" in source
    compiles_for_sm90a(source, tmp_path)


def _assert_matches_numpy(spec, config):
    skip_unless_sm90()
    kernel = build(spec, "cuda", config=config, db=None)
    assert kernel.func_names == ["fused_dw3x3_conv1x1_cluster"]
    arrays = random_inputs(spec, seed=7)
    err, ok = compare(spec, kernel(**arrays), reference(spec, **arrays))
    assert ok, f"max abs error {err}"


@pytest.mark.gpu
@pytest.mark.parametrize("case,config", CASES)
def test_kernel_matches_numpy_on_hopper(cluster_on, case, config):
    _assert_matches_numpy(depthwise(case), config)


def _random_pair(n, h, w, c, k2_tiles, stride, residual):
    return depthwise(f"n={n},h={h},w={w},c={c},k1={c},k2={8 * k2_tiles},stride={stride},residual={int(residual)}")


@pytest.mark.gpu
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=st.builds(_random_pair, st.integers(1, 3), st.integers(2, 17), st.integers(2, 17),
                      st.sampled_from([16, 48, 96, 240]), st.integers(1, 12), st.sampled_from([1, 2]), st.booleans()),
       data=st.data())
def test_random_shapes_match_numpy(cluster_on, spec, data):
    """Random sizes (odd ones, stride 2, k2 in any number of n8 tiles, residual where the shapes allow) at a random
    config: the default or any cluster, pixel tile, step and warps it takes."""
    _assert_matches_numpy(spec, data.draw(st.one_of(st.none(), random_configs(spec))))


def random_configs(spec):
    """Every config the kernel takes for the spec (config_problem: steps that divide the slice, the accumulators, shared
    memory) with a portable cluster."""
    configs = [cluster.ClusterConfig(bm, cs, kc, warps) for cs in cluster.cluster_sizes(spec)
               if cs <= cluster.PORTABLE_CLUSTER
               for kc in [0, *range(16, spec.k1 // cs, 16)] for bm in (16, 32, 64) for warps in (4, 8)]
    return st.sampled_from([cfg for cfg in configs if cluster.config_problem(spec, cfg) is None])


def test_a_template_config_builds_the_templates_kernel():
    """A config of the template's (as text or object) for a pair this kernel takes by default: the template's kernel
    (a config picks the kernel it was made for); parameters of neither: one line."""
    from tvm_b2b.schedule.cuda_wmma import WmmaConfig

    spec = depthwise("n=1,h=14,w=14,c=384,k1=384,k2=64")
    assert any("cluster" in name for name in build(spec, "cuda:sm_90", db=None).func_names)
    for config in ("m_tile=32,k_tile=64", WmmaConfig(m_tile=32, k_tile=64)):
        assert not any("cluster" in name for name in build(spec, "cuda:sm_90", config=config, db=None).func_names)
    with pytest.raises(ValueError, match="bogus") as raised:
        build(spec, "cuda:sm_90", config="bogus=1", db=None)
    assert "\n" not in str(raised.value)
