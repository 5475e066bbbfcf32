"""One benchmark process: ``python -m bench.worker {memory,batch,threads,precision,percall} ...``, JSON out.

The parent (``bench.memory``, ``bench.batch``, ``bench.threads``) starts each run in a fresh process, so
no runtime inherits another's heap, graph or kernel caches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import nlp  # noqa: F401  (sets TF_KERAS before TensorFlow is imported)
from bench.common import MIB, RAW_DIR, cdf_points, cpu_info, percentiles_ms, slope_second_half
from bench.rbt6 import flops_per_token, int8_dir, model_dirs, vocab_size
from bench.runtimes import NAIVE, extractor_for
from bench.workload import request_texts, texts
from nlp.config import LoadOptions
from nlp.loader import load_extractor

BATCHES = (1, 8, 32)
BATCH_LENGTH = 128


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def _dirs() -> dict[str, str]:
    return {k: str(v) for k, v in model_dirs().items()} | {"int8": str(int8_dir())}


def memory(args: argparse.Namespace) -> dict[str, Any]:
    """Single-text requests through one runtime; RSS every ``rss_every`` requests."""
    rss_start = _rss()
    started = time.perf_counter()
    ex = extractor_for(args.runtime, _dirs(), args.intra, args.inter)
    cold = time.perf_counter() - started
    stream = request_texts(args.requests)
    naive = args.runtime in NAIVE
    samples: list[tuple[int, int]] = [(0, _rss())]
    latencies: list[float] = []
    new_shape: list[bool] = []
    deadline = time.perf_counter() + args.max_seconds
    loop_started = time.perf_counter()
    done = 0
    for i, text in enumerate(stream, 1):
        seen = len(ex.runtime.shapes_fed)
        t = time.perf_counter()
        ex.extract(text)
        latencies.append(time.perf_counter() - t)
        # A shape the naive runtime had not run before (the spo runtime warmed all of its shapes).
        new_shape.append(naive and len(ex.runtime.shapes_fed) > seen)
        done = i
        if i % args.rss_every == 0 or i == len(stream):
            samples.append((i, _rss()))
        if time.perf_counter() > deadline:
            if samples[-1][0] != i:
                samples.append((i, _rss()))
            break
    elapsed = time.perf_counter() - loop_started
    RAW_DIR.mkdir(parents=True, exist_ok=True)
    np.save(RAW_DIR / f"latency-{args.runtime}.npy", np.asarray(latencies))
    reqs = [s[0] for s in samples]
    rss = [s[1] for s in samples]
    warm_point = min(2000, done // 4)
    at_warm = next(r for n, r in samples if n >= warm_point)
    lat = np.asarray(latencies)
    flags = np.asarray(new_shape, dtype=bool)
    shapes_fed = sorted(ex.runtime.shapes_fed)
    return {
        "runtime": args.runtime,
        "model_key": Path(_dirs()["graph"]).parent.name,
        "requests_asked": args.requests,
        "requests": done,
        "stopped_by_time": done < args.requests,
        "intra_op_threads": args.intra,
        "inter_op_threads": args.inter,
        "rss_before_load_mib": round(rss_start / MIB, 1),
        "rss_samples": [[n, round(r / MIB, 2)] for n, r in samples],
        "rss_after_load_mib": round(rss[0] / MIB, 1),
        "rss_end_mib": round(rss[-1] / MIB, 1),
        "growth_from_load_mib": round((rss[-1] - rss[0]) / MIB, 1),
        "warm_point": warm_point,
        "growth_after_warm_mib": round((rss[-1] - at_warm) / MIB, 2),
        "growth_after_warm_pct": round(100.0 * (rss[-1] - at_warm) / at_warm, 3),
        "slope_bytes_per_request": slope_second_half(reqs, rss),
        "latency_ms": percentiles_ms(latencies),
        "latency_cdf_ms": cdf_points(latencies),
        "texts_per_s": round(done / elapsed, 3),
        "cold_start_s": round(cold, 2),
        "load_s": round(ex.runtime.load_seconds, 2),
        "warm_s": round(ex.runtime.warm_seconds, 2),
        "shapes_seen": len(shapes_fed),
        "shapes_warmed": len(ex.runtime.shapes),
        "new_shape_requests": int(flags.sum()),
        "new_shape_latency_ms": round(float(lat[flags].mean()) * 1000, 1) if flags.any() else None,
        "seen_shape_latency_ms": round(float(lat[~flags].mean()) * 1000, 1)
        if (~flags).any()
        else None,
    }


def _peak(dtype: str, intra: int, inter: int, n: int = 2048, repeats: int = 8) -> float:
    """Dense n x n matmul GFLOP/s in a compat.v1 Session with the given threads (best of repeats)."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.default_rng(0)
        a = tf.constant(rng.standard_normal((n, n), dtype=np.float32))
        b = tf.constant(rng.standard_normal((n, n), dtype=np.float32))
        if dtype == "bf16":
            a, b = tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16)
            a, b = tf.Variable(a), tf.Variable(b)
        else:
            a, b = tf.Variable(a), tf.Variable(b)
        # A reduction keeps the fetch small, so the timing is the matmul, not the copy out.
        product = tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32))
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=intra, inter_op_parallelism_threads=inter
    )
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        session.run(init)
        session.run(product)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            session.run(product)
            times.append(time.perf_counter() - t)
    return 2.0 * n**3 / min(times) / 1e9


def _options(args: argparse.Namespace, model_dir: str | None = None) -> LoadOptions:
    return LoadOptions(
        Path(model_dir or _dirs()["int8" if args.precision == "int8" else "graph"]),
        precision=args.precision,
        intra_op_threads=args.intra,
        inter_op_threads=args.inter,
    )


def _session_runtime(shapes: list[tuple[int, int]], args: argparse.Namespace) -> Any:
    """The spo runtime alone over the RBT6 graph export, warmed on ``shapes``."""
    from nlp.manifest import load_manifest
    from nlp.runtime import SessionRuntime

    options = _options(args)
    manifest = load_manifest(options.model_dir)
    return SessionRuntime.for_model(manifest, options, shapes=shapes, vocab_size=vocab_size())


def batch(args: argparse.Namespace) -> dict[str, Any]:
    """Model-only throughput at batch 1/8/32 x length 128, then end-to-end ``extract_batch``."""
    out: dict[str, Any] = {
        "model_key": Path(_dirs()["graph"]).parent.name,
        "precision": args.precision,
        "intra_op_threads": args.intra,
        "inter_op_threads": args.inter,
        "length": BATCH_LENGTH,
    }
    if args.peaks:
        out["peak_gflops"] = {"fp32": round(_peak("fp32", args.intra, args.inter), 1)}
        from nlp.engine import cpu_supports_bf16

        if cpu_supports_bf16():
            out["peak_gflops"]["bf16"] = round(_peak("bf16", args.intra, args.inter), 1)
    started = time.perf_counter()
    runtime = _session_runtime([(b, BATCH_LENGTH) for b in BATCHES], args)
    out["load_warm_s"] = round(time.perf_counter() - started, 2)
    fpt = flops_per_token(BATCH_LENGTH)
    out["flops_per_token"] = fpt
    rng = np.random.default_rng(1)
    model_rows = []
    for b in BATCHES:
        ids = rng.integers(672, 21000, size=(b, BATCH_LENGTH)).astype(np.int32)
        seg = np.zeros_like(ids)
        runs, t0 = 0, time.perf_counter()
        while runs < 3 or (time.perf_counter() - t0 < args.seconds and runs < 200):
            runtime.run(ids, seg)
            runs += 1
        per_run = (time.perf_counter() - t0) / runs
        tokens_s = b * BATCH_LENGTH / per_run
        model_rows.append(
            {
                "batch": b,
                "runs": runs,
                "ms_per_run": round(per_run * 1000, 1),
                "texts_per_s": round(b / per_run, 2),
                "tokens_per_s": round(tokens_s, 1),
                "gflops": round(tokens_s * fpt / 1e9, 1),
            }
        )
    runtime.close()
    out["model"] = model_rows
    # End to end: real texts through tokenize -> bucket -> run -> decode, `batch` texts a call.
    ex = load_extractor(_options(args))
    sample = list(texts())[: args.texts]
    e2e = []
    results: list[Any] = []
    for b in BATCHES:
        t0 = time.perf_counter()
        got = []
        for i in range(0, len(sample), b):
            got.extend(ex.extract_batch(sample[i : i + b]))
        dt = time.perf_counter() - t0
        e2e.append({"batch": b, "texts": len(sample), "texts_per_s": round(len(sample) / dt, 2)})
        if b == BATCHES[-1]:
            results = got
    ex.close()
    out["end_to_end"] = e2e
    RAW_DIR.mkdir(parents=True, exist_ok=True)
    triples = [
        sorted(
            [
                t.subject.span.start,
                t.subject.span.end,
                t.predicate,
                t.object.span.start,
                t.object.span.end,
            ]
            for t in r.triples
        )
        for r in results
    ]
    (RAW_DIR / f"triples-{args.precision}.json").write_text(json.dumps(triples, ensure_ascii=False))
    return out


def precision(args: argparse.Namespace) -> dict[str, Any]:
    """The demo model at one precision: triples on the evaluation sets, single-text and batch speed."""
    from nlp.runtime import SessionRuntime
    from training.evaluate import gold_triples, predict_triples, read_records, score

    started = time.perf_counter()
    ex = load_extractor(_options(args, args.model))
    out: dict[str, Any] = {
        "precision": args.precision,
        "model": args.model,
        "cold_start_s": round(time.perf_counter() - started, 2),
        "rss_after_load_mib": round(_rss() / MIB, 1),
        "frozen": isinstance(ex.runtime, SessionRuntime) and ex.runtime.frozen,
        "sets": {},
    }
    all_texts: list[str] = []
    for path in args.data:
        records = read_records(Path(path))
        texts_ = [r["text"] for r in records]
        all_texts += texts_
        t0 = time.perf_counter()
        predicted = predict_triples(ex, texts_)
        batch_s = time.perf_counter() - t0
        scores = score(predicted, [gold_triples(r) for r in records])
        out["sets"][Path(path).name] = {
            "records": len(records),
            "scores": scores.to_dict(),
            "batch_texts_per_s": round(len(records) / batch_s, 1),
            "predicted": [sorted(p) for p in predicted],
        }
    sample = all_texts[: args.texts]
    latencies = []
    for text in sample:
        t = time.perf_counter()
        ex.extract(text)
        latencies.append(time.perf_counter() - t)
    out["single_text"] = {
        "texts": len(sample),
        "texts_per_s": round(len(sample) / sum(latencies), 1),
        "latency_ms": percentiles_ms(latencies),
    }
    out["rss_end_mib"] = round(_rss() / MIB, 1)
    ex.close()
    return out


PERCALL_LENGTHS = (16, 24, 40, 64, 96, 128, 200, 256)


def percall(args: argparse.Namespace) -> dict[str, Any]:
    """Model-call latency of one runtime at equal one-row shapes (no tokenizing, no decoding)."""
    if args.runtime in NAIVE:
        ex = extractor_for(args.runtime, _dirs(), args.intra, args.inter)
        run = ex.runtime.run
    else:
        run = _session_runtime([(1, n) for n in PERCALL_LENGTHS], args).run
    rng = np.random.default_rng(3)
    rows = []
    for n in PERCALL_LENGTHS:
        ids = rng.integers(672, 21000, size=(1, n)).astype(np.int32)
        seg = np.zeros_like(ids)
        for _ in range(3):
            run(ids, seg)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            run(ids, seg)
            times.append(time.perf_counter() - t)
        rows.append({"length": n, "median_ms": round(float(np.median(times)) * 1000, 2)})
    return {"runtime": args.runtime, "precision": args.precision, "rows": rows}


def _spo_modes(dirs: dict[str, str]) -> dict[str, tuple[str, str]]:
    """spo's precisions on the RBT6 model: ``{"spo-<precision>": (model_dir, precision)}``.

    Every mode ``nlp.config`` declares is picked up: bf16 only on a CPU with bf16; a mode that needs
    its own model directory (int8) when ``dirs`` has one under its name (``--mode-dir``).
    """
    from nlp.config import PRECISIONS
    from nlp.engine import cpu_supports_bf16

    modes = {}
    for precision in PRECISIONS:
        if precision == "bf16" and not cpu_supports_bf16():
            continue
        if precision in ("fp32", "bf16"):
            modes[f"spo-{precision}"] = (dirs["graph"], precision)
        elif precision in dirs and (Path(dirs[precision]) / "model.json").is_file():
            # ``_dirs`` names the int8 copy whether or not it was made (no quantize extra here).
            modes[f"spo-{precision}"] = (dirs[precision], precision)
    return modes


def peer(args: argparse.Namespace) -> dict[str, Any]:
    """spo's precisions, ONNX Runtime and OpenVINO, interleaved in one process (``bench.peer``)."""
    from bench.peer import CALLS, SHAPES, WORKLOAD_BLOCK, onnx_dirs, ov_runtimes
    from nlp.bucketing import BucketSpec
    from nlp.manifest import load_manifest
    from nlp.onnx_runtime import OnnxRuntime
    from nlp.pipeline import Extractor
    from nlp.runtime import SessionRuntime
    from nlp.tokenization import Tokenizer

    dirs = _dirs()
    dirs.update(item.split("=", 1) for item in args.mode_dir)
    manifest = load_manifest(dirs["graph"])
    tokenizer = Tokenizer.from_file(manifest.vocab_path, do_lower_case=manifest.do_lower_case)
    # Single-text requests, windows of long texts included, run as one-row batches at the length
    # buckets (no 8-token step: 9 warm-up shapes instead of 38, the same for every runtime).
    buckets = BucketSpec(manifest.length_buckets, (1,), None, single_row_step=None)
    shapes = sorted(set(buckets.shapes()) | set(SHAPES))
    common = {
        "shapes": shapes,
        "input_names": manifest.input_names,
        "output_names": manifest.output_names,
        "n_outputs": manifest.n_outputs,
        "vocab_size": tokenizer.vocab_size,
        "intra_op_threads": args.intra,
        "inter_op_threads": args.inter,
    }
    runtimes: dict[str, Any] = {}
    loads: dict[str, dict[str, float]] = {}
    for name, (model_dir, precision) in _spo_modes(dirs).items():
        started = time.perf_counter()
        runtimes[name] = SessionRuntime(model_dir, precision=precision, **common)  # type: ignore[arg-type]
        loads[name] = {"load_warm_s": round(time.perf_counter() - started, 1)}
        print(f"peer: {name} loaded and warmed in {loads[name]['load_warm_s']} s", file=sys.stderr)
    for name, model_dir in onnx_dirs().items():
        converted = load_manifest(model_dir)
        assert converted.engine_spec is not None
        started = time.perf_counter()
        runtimes[name] = OnnxRuntime(converted.engine_spec.file, **common)  # type: ignore[arg-type]
        loads[name] = {"load_warm_s": round(time.perf_counter() - started, 1)}
        print(f"peer: {name} loaded and warmed in {loads[name]['load_warm_s']} s", file=sys.stderr)
    # OpenVINO, when the parent converted the model for it (``--mode-dir openvino-<precision>=DIR``).
    ov_dirs = {k.split("-", 1)[1]: v for k, v in dirs.items() if k.startswith("openvino-")}
    if ov_dirs:
        from nlp.openvino_runtime import OpenVinoRuntime

        bf16_cpu = cpu_info()["bf16"]
        for name, (model_dir, precision) in ov_runtimes(ov_dirs, bf16_cpu).items():
            converted = load_manifest(model_dir)
            assert converted.engine_spec is not None
            started = time.perf_counter()
            # The conversion names its own inputs and outputs (no ``:0`` tensor suffixes).
            own = common | {
                "input_names": converted.input_names,
                "output_names": converted.output_names,
            }
            runtimes[name] = OpenVinoRuntime(
                converted.engine_spec.file,
                precision=precision,
                **own,  # type: ignore[arg-type]
            )
            loads[name] = {"load_warm_s": round(time.perf_counter() - started, 1)}
            print(
                f"peer: {name} loaded and warmed in {loads[name]['load_warm_s']} s", file=sys.stderr
            )
    rng = np.random.default_rng(5)
    timings: dict[str, dict[str, list[float]]] = {r: {} for r in runtimes}
    for _ in range(args.repeats):
        for batch_, length in SHAPES:
            ids = rng.integers(672, 21000, size=(batch_, length)).astype(np.int32)
            seg = np.zeros_like(ids)
            for name, runtime in runtimes.items():
                for _ in range(3):
                    runtime.run(ids, seg)
                for _ in range(CALLS):
                    t = time.perf_counter()
                    runtime.run(ids, seg)
                    timings[name].setdefault(f"{batch_}x{length}", []).append(
                        time.perf_counter() - t
                    )
    percall_ms = {
        name: {k: round(float(np.median(v)) * 1000, 2) for k, v in rows.items()}
        for name, rows in timings.items()
    }
    print("peer: per-call rounds done; workload next", file=sys.stderr)
    extractors = {
        name: Extractor(manifest, tokenizer, runtime, buckets=buckets)
        for name, runtime in runtimes.items()
    }
    stream = request_texts(args.texts)
    spent = dict.fromkeys(extractors, 0.0)
    triples: dict[str, list[Any]] = {name: [] for name in extractors}
    for start in range(0, len(stream), WORKLOAD_BLOCK):
        block = stream[start : start + WORKLOAD_BLOCK]
        for name, ex in extractors.items():
            t = time.perf_counter()
            got = [ex.extract(text) for text in block]
            spent[name] += time.perf_counter() - t
            triples[name] += [r.triples for r in got]
    workload = {}
    for name in extractors:
        same = sum(a == b for a, b in zip(triples[name], triples["spo-fp32"], strict=True))
        workload[name] = {
            "texts": len(stream),
            "texts_per_s": round(len(stream) / spent[name], 2),
            "same_triples_as_spo_fp32": same,
        }
    return {
        "model_key": Path(dirs["graph"]).parent.name,
        "load": loads,
        "percall": percall_ms,
        "workload": workload,
        "rss_end_mib": round(_rss() / MIB, 1),
    }


INT8_LENGTHS = (16, 32, 64, 128, 256)
INT8_BATCH = (8, 128)


def int8(args: argparse.Namespace) -> dict[str, Any]:
    """spo fp32 and spo int8 in one process, interleaved: model calls at the issue's shapes, then
    single-text requests of the workload in alternating blocks (same texts for both)."""
    runtimes = {
        p: extractor_for("spo", _dirs(), args.intra, args.inter, precision=p)
        for p in ("fp32", "int8")
    }
    rng = np.random.default_rng(3)
    shapes = [(1, n) for n in INT8_LENGTHS] + [INT8_BATCH]
    inputs = {s: rng.integers(672, 21000, size=s).astype(np.int32) for s in shapes}
    calls: dict[str, dict[str, list[float]]] = {p: {} for p in runtimes}
    for _ in range(args.rounds):
        for p, ex in runtimes.items():
            for shape, ids in inputs.items():
                seg = np.zeros_like(ids)
                for _ in range(2):
                    ex.runtime.run(ids, seg)
                times = calls[p].setdefault(f"{shape[0]}x{shape[1]}", [])
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    ex.runtime.run(ids, seg)
                    times.append(time.perf_counter() - t)
    stream = request_texts(args.requests)
    block = 25
    latencies: dict[str, list[float]] = {p: [] for p in runtimes}
    for i in range(0, len(stream), block):
        for p, ex in runtimes.items():
            for text in stream[i : i + block]:
                t = time.perf_counter()
                ex.extract(text)
                latencies[p].append(time.perf_counter() - t)
    out: dict[str, Any] = {"rounds": args.rounds, "repeats": args.repeats, "requests": len(stream)}
    for p in runtimes:
        out[p] = {
            "median_ms": {k: round(float(np.median(v)) * 1000, 2) for k, v in calls[p].items()},
            "single_text": {
                "texts_per_s": round(len(latencies[p]) / sum(latencies[p]), 2),
                "latency_ms": percentiles_ms(latencies[p]),
            },
        }
    out["speedup"] = {
        k: round(out["fp32"]["median_ms"][k] / out["int8"]["median_ms"][k], 2)
        for k in out["fp32"]["median_ms"]
    } | {
        "single_text_texts_per_s": round(
            out["int8"]["single_text"]["texts_per_s"] / out["fp32"]["single_text"]["texts_per_s"],
            2,
        )
    }
    return out


def profile(args: argparse.Namespace) -> dict[str, Any]:
    """spo fp32 (and int8 where its directory exists) with and without the graph rewrites, in one
    process: interleaved median latency per shape, then time per op type from traced calls."""
    from bench.op_profile import SHAPES, TRACED_CALLS, op_time_by_type
    from nlp.manifest import load_manifest
    from nlp.runtime import SessionRuntime

    dirs = _dirs()
    manifest = load_manifest(dirs["graph"])
    common = {
        "shapes": list(SHAPES),
        "input_names": manifest.input_names,
        "output_names": manifest.output_names,
        "n_outputs": manifest.n_outputs,
        "vocab_size": vocab_size(),
        "intra_op_threads": args.intra,
        "inter_op_threads": args.inter,
    }
    modes = {"fp32": dirs["graph"]}
    if Path(dirs["int8"], "model.json").is_file():
        modes["int8"] = dirs["int8"]
    runtimes: dict[str, SessionRuntime] = {}
    for precision, model_dir in modes.items():
        for rewritten in (False, True):
            name = f"spo-{precision}" + ("" if rewritten else " unrewritten")
            runtimes[name] = SessionRuntime(
                model_dir, precision=precision, freeze=True, graph_rewrites=rewritten, **common
            )
            print(f"profile: {name} loaded ({runtimes[name].op_count} ops)", file=sys.stderr)
    rng = np.random.default_rng(7)
    inputs = {s: rng.integers(672, 21000, size=s).astype(np.int32) for s in SHAPES}
    timings: dict[str, dict[str, list[float]]] = {name: {} for name in runtimes}
    for _ in range(args.rounds):
        for shape, ids in inputs.items():
            seg = np.zeros_like(ids)
            for name, runtime in runtimes.items():
                for _ in range(3):
                    runtime.run(ids, seg)
                times = timings[name].setdefault(f"{shape[0]}x{shape[1]}", [])
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    runtime.run(ids, seg)
                    times.append(time.perf_counter() - t)
    by_type: dict[str, dict[str, dict[str, float]]] = {name: {} for name in runtimes}
    for shape, ids in inputs.items():
        seg = np.zeros_like(ids)
        for name, runtime in runtimes.items():
            traced = [op_time_by_type(runtime, ids, seg) for _ in range(TRACED_CALLS)]
            types = set().union(*traced)
            by_type[name][f"{shape[0]}x{shape[1]}"] = {
                t: round(float(np.median([c.get(t, 0.0) for c in traced])), 3) for t in types
            }
    return {
        "runtimes": {
            name: {
                "op_count": runtime.op_count,
                "rewrites": runtime.rewrites,
                "median_ms": {
                    k: round(float(np.median(v)) * 1000, 2) for k, v in timings[name].items()
                },
                "ms_by_op_type": by_type[name],
            }
            for name, runtime in runtimes.items()
        }
    }


def threads(args: argparse.Namespace) -> dict[str, Any]:
    """Load spo, say READY, wait for a line on stdin, then time ``requests`` single-text requests."""
    ex = extractor_for("spo", _dirs(), args.intra, args.inter)
    stream = request_texts(args.requests * (args.offset + 1))[args.offset * args.requests :]
    ex.extract(stream[0])
    print("READY", flush=True)
    sys.stdin.readline()
    latencies = []
    t0 = time.perf_counter()
    for text in stream:
        t = time.perf_counter()
        ex.extract(text)
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    return {"requests": len(stream), "seconds": elapsed, "latency_ms": percentiles_ms(latencies)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    parser.add_argument(
        "mode",
        choices=("memory", "batch", "threads", "precision", "percall", "peer", "int8", "profile"),
    )
    parser.add_argument("--runtime", default="spo")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rss-every", type=int, default=500)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument("--intra", type=int, default=2)
    parser.add_argument("--inter", type=int, default=1)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--peaks", action="store_true")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--model", default="models/demo")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--data", nargs="*", default=[])
    parser.add_argument("--mode-dir", action="append", default=[], help="PRECISION=MODEL_DIR")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    modes = {
        "memory": memory,
        "batch": batch,
        "threads": threads,
        "precision": precision,
        "percall": percall,
        "peer": peer,
        "int8": int8,
        "profile": profile,
    }
    result = modes[args.mode](args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
