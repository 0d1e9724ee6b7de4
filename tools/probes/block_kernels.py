"""Which kernels one mx.compile'd forward of the decoder block launches, unconverted and
converted with `auto` (benchmarks/decoder_block.py's sizes), to place a converted
block's extra time: run `tune` first (measures and persists auto's routing decisions),
then `trace` under ncu (reads them; no measurement), e.g.

    python3 tools/probes/block_kernels.py tune 2048
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        python3 tools/probes/block_kernels.py trace 2048 > kernels.csv

`trace` runs each variant's compiled forward once after a warm-up, each preceded by a
separator kernel (a cumsum: a scan the block never launches), so the kernels after the
n-th scan are the n-th variant's; `trace ... --time` instead times both
(CUDA-synchronized wall time, 20 calls per variant).
"""
import importlib.util
import sys
import time
from pathlib import Path

import mlx.core as mx

import metile

root = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("decoder_block", root / "examples" / "decoder_block.py")
db = importlib.util.module_from_spec(spec)
sys.modules.setdefault("decoder_block", db)
spec.loader.exec_module(db)


def main():
    phase, tokens = sys.argv[1], int(sys.argv[2])
    from metile import ops
    if "--no-addmm" in sys.argv:     # the residual composite as matmul + add
        ops._linear_mlx_residual = lambda x2, w, bias, act, slope, residual=None: (
            ops._linear_mlx(x2, w, bias, act, slope) if residual is None else
            ops._linear_mlx(x2, w, bias, act, slope) + residual)
    if "--mlx-gated" in sys.argv:    # the gated MLP as MLX's composite
        ops._fused_gated = lambda activation, block: (
            lambda x2, wg, wu: ops._gated_mlx(x2, wg, wu, activation))
    dtype = sys.argv[3] if len(sys.argv) > 3 else "float16"
    cfg = db.Config(vocab=8, dims=4096, heads=32, kv_heads=8, hidden=11008, layers=1,
                    dtype=dtype)
    reference = db.build(cfg, seed=0)
    auto = db.Decoder(cfg)
    auto.update(reference.parameters())
    db.convert_all(auto, "auto")
    x = mx.random.normal((1, tokens, cfg.dims), key=mx.random.key(1)).astype(getattr(mx, dtype))
    mx.eval(x)
    if phase == "tune":
        with metile.ops.tuning():
            mx.eval(auto.blocks(x))
        print("tuned")
        return
    traces = {}
    owners = {id(m.layers[0].mlp): name for name, m in (("unconverted", reference), ("auto", auto))}
    for cls in {type(m.layers[0].mlp) for m in (reference, auto)}:
        # counts the MLPs' Python calls: under mx.compile each is a trace
        def counting(self, *a, _call=cls.__call__, **k):
            name = owners.get(id(self))
            traces[name] = traces.get(name, 0) + 1
            return _call(self, *a, **k)
        cls.__call__ = counting
    fwds = {name: mx.compile(lambda x, model=model: model.blocks(x), inputs=model.state)
            for name, model in (("unconverted", reference), ("auto", auto))}
    for fwd in fwds.values():
        mx.eval(fwd(x))
    mx.synchronize()
    for name, fwd in fwds.items():
        if "--time" in sys.argv:
            start = time.perf_counter()
            outs = [fwd(x) for _ in range(20)]
            built = time.perf_counter()
            mx.eval(outs)
            mx.synchronize()
            end = time.perf_counter()
            print(f"{name}: {(end - start) / 20 * 1e6:.1f} us per forward, of which "
                  f"{(built - start) / 20 * 1e6:.1f} us building the calls; MLP traces so far: "
                  f"{traces.get(name, 0)}", flush=True)
        else:
            mx.eval(mx.cumsum(mx.ones((3,))))
            mx.eval(fwd(x))
            mx.synchronize()


if __name__ == "__main__":
    main()
