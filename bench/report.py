"""Charts (PNG) and the Markdown tables of ``BENCHMARKS.md``, from ``bench/results/*.json``.

The tables go between ``<!-- bench:tables -->`` and ``<!-- /bench:tables -->`` in ``BENCHMARKS.md``,
so the prose around them stays hand-written and the figures are always the last run's.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import PROJECT_ROOT, RESULTS_DIR, cpu_info, machine_label, read_result

logger = logging.getLogger(__name__)

BEGIN, END = "<!-- bench:tables -->", "<!-- /bench:tables -->"
BENCHMARKS_MD = PROJECT_ROOT / "BENCHMARKS.md"


def charts() -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    memory = read_result("memory")
    if memory:
        fig, (ax, zoom) = plt.subplots(1, 2, figsize=(13, 4.5))
        for r in memory["runtimes"]:
            xs, ys = zip(*r["rss_samples"], strict=True)
            ax.plot(xs, ys, marker=".", label=r["runtime"])
            # Right panel: change since the reference point (request 2,000, or the first
            # sample after it), so a flat line reads as flat whatever the process's size.
            ref = next((y for x, y in zip(xs, ys, strict=True) if x >= 2000), ys[-1])
            zoom.plot(xs, [y - ref for y in ys], marker=".", label=r["runtime"])
        ax.set_xlabel("requests")
        ax.set_ylabel("RSS (MiB)")
        ax.set_title("RSS vs requests (RBT6 GPLinker, single-text requests)")
        ax.grid(alpha=0.3)
        ax.legend()
        zoom.set_xlabel("requests")
        zoom.set_ylabel("RSS minus RSS at request 2,000 (MiB)")
        zoom.set_ylim(-100, 300)
        zoom.set_title("Change from request 2,000 (clipped at +300 MiB)")
        zoom.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(RESULTS_DIR / "rss.png", dpi=110)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in memory["runtimes"]:
            qs = r["latency_cdf_ms"]
            ax.plot(qs, [i / (len(qs) - 1) for i in range(len(qs))], label=r["runtime"])
        ax.set_xscale("log")
        ax.set_xlabel("latency per request (ms, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("Latency CDF, single-text requests")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS_DIR / "latency_cdf.png", dpi=110)
        plt.close(fig)
        made += ["rss.png", "latency_cdf.png"]
    http = read_result("http")
    if http:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for i, (_pid, series) in enumerate(sorted(http["rss_per_worker"].items())):
            xs, ys = zip(*series, strict=True)
            ax.plot(xs, ys, label=f"worker {i + 1}")
        ax.set_xlabel("seconds into the soak")
        ax.set_ylabel("RSS (MiB)")
        ax.set_title(
            f"HTTP soak: per-worker RSS ({http['requests']} requests, c={http['concurrency']})"
        )
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS_DIR / "http_rss.png", dpi=110)
        plt.close(fig)
        made.append("http_rss.png")
    return made


def _on(doc: dict[str, Any]) -> str:
    """A table's time stamp and the machine it ran on (results carry ``machine`` from ``cpu_info``)."""
    machine = doc.get("machine")
    return f"{doc['when']}; {machine_label(machine)}" if machine else doc["when"]


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def tables() -> str:
    out: list[str] = []
    cpu = cpu_info()
    out += [
        f"This machine: {machine_label(cpu)}, {cpu['cpus']} CPUs, {cpu['memory_gib']} GiB; "
        f"SIMD flags: {' '.join(cpu['flags_simd'])}. Each table names the machine it was measured "
        "on (the CPU model, its family and model numbers where recorded, and whether it has AMX): "
        "ratios within one table are comparable, "
        "absolute times across tables from different machines are not.",
        "",
    ]
    memory = read_result("memory")
    if memory:
        out += [
            "### Memory and latency (single-text requests; the count per runtime is in the table; "
            f"intra-op {memory['intra_op_threads']}, inter-op {memory['inter_op_threads']}; {_on(memory)})",
            "",
            "| runtime | requests | RSS after load | RSS end | growth after warm-up (from request) "
            "| slope 2nd half | p50 | p95 | p99 | texts/s | cold start (load + warm) | shapes seen "
            "| first-seen shape: mean latency | machine |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in memory["runtimes"]:
            lat = r["latency_ms"]
            slope = r["slope_bytes_per_request"]
            out.append(
                f"| {r['runtime']} | {r['requests']:,} | {r['rss_after_load_mib']:,.0f} MiB "
                f"| {r['rss_end_mib']:,.0f} MiB | {r['growth_after_warm_mib']:+,.1f} MiB "
                f"({r['growth_after_warm_pct']:+.2f}%, from {r['warm_point']:,}) "
                f"| {_fmt(slope, 0)} B/req | {lat['p50']:.0f} ms | {lat['p95']:.0f} ms "
                f"| {lat['p99']:.0f} ms | {r['texts_per_s']:.2f} "
                f"| {r['cold_start_s']:.1f} s ({r['load_s']:.1f} + {r['warm_s']:.1f}) "
                f"| {r['shapes_seen']} (warmed {r['shapes_warmed']}) "
                f"| {_fmt(r['new_shape_latency_ms'])} ms vs {_fmt(r['seen_shape_latency_ms'])} ms "
                f"| {machine_label(r.get('machine') or memory['machine'])} |"
            )
        out.append("")
    batch = read_result("batch")
    if batch:
        peaks = batch["peak_gflops"]
        out += [
            f"### Batch throughput (length 128, model only; {_on(batch)})",
            "",
            "Measured 2048x2048 matmul peak in a Session with the same threads: "
            + ", ".join(f"{k} {v:,.0f} GFLOP/s" for k, v in peaks.items())
            + f". FLOPs per token at length 128: {batch['runs']['fp32']['flops_per_token'] / 1e6:.1f} M.",
            "",
            "| precision | batch | ms/run | texts/s | tokens/s | GFLOP/s | % of peak | end-to-end texts/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for precision, run in batch["runs"].items():
            e2e = {e["batch"]: e for e in run["end_to_end"]}
            for m in run["model"]:
                out.append(
                    f"| {precision} | {m['batch']} | {m['ms_per_run']:.1f} | {m['texts_per_s']:.1f} "
                    f"| {m['tokens_per_s']:,.0f} | {m['gflops']:.0f} | {_fmt(m['pct_of_peak'])}% "
                    f"| {e2e[m['batch']]['texts_per_s']:.1f} ({e2e[m['batch']]['texts']} texts) |"
                )
        agree = batch.get("bf16_agreement")
        if agree:
            out += [
                "",
                f"bf16 vs fp32 on {agree['texts']} workload texts (RBT6, random weights): "
                f"{agree['identical_texts']} texts with identical triples, triple F1 vs fp32 "
                f"{agree['f1_vs_fp32']} ({agree['triples_fp32']} fp32 / {agree['triples_bf16']} bf16 triples).",
            ]
        out.append("")
    padding = read_result("padding")
    if padding:
        out += [
            f"### Padding waste ({padding['texts']:,} workload texts, {padding['windows']:,} windows; "
            f"tokens p50 {padding['tokens_p50']}, p95 {padding['tokens_p95']}, max {padding['tokens_max']})",
            "",
            "| length buckets | padded / real tokens, single texts | FLOP waste, single texts "
            "| padded / real, batches of 32 texts | warm-up shapes | warm-up TFLOP "
            "| warm-up s (estimated) |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in padding["sets"]:
            out.append(
                f"| {s['name']}: {', '.join(map(str, s['length_buckets']))} "
                f"| {100 * s['padding_waste']:.1f}% | {100 * s['flop_waste']:.1f}% "
                f"| {100 * s.get('padding_waste_batch32', s['padding_waste']):.1f}% | {s['warm_shapes']} "
                f"| {s['warm_tflop']:.2f} | {_fmt(s.get('warm_s_estimated'))} |"
            )
        out.append("")
    threads = read_result("threads")
    if threads:
        out += [
            f"### Thread settings ({threads['requests_per_worker']} single-text requests per worker, "
            "workers started together)",
            "",
            "| workers | intra-op | inter-op | texts/s (all workers) | p50 | p99 |",
            "|---|---|---|---|---|---|",
        ]
        for c in threads["configs"]:
            out.append(
                f"| {c['workers']} | {c['intra_op_threads']} | {c['inter_op_threads']} "
                f"| {c['texts_per_s']:.2f} | {c['p50_ms']:.0f} ms | {c['p99_ms']:.0f} ms |"
            )
        out.append("")
    http = read_result("http")
    if http:
        lat = http["latency_ms"]
        rss = "; ".join(
            f"worker {i + 1}: {a:,.0f} -> {b:,.0f} MiB ({d:+,.0f})"
            for i, (a, b, d) in enumerate(http["rss_first_last_mib"].values())
        )
        out += [
            f"### HTTP soak ({http['requests']:,} requests, concurrency {http['concurrency']}, "
            f"{http['workers']} gunicorn workers, jemalloc {'on' if http['jemalloc'] else 'off'}; {_on(http)})",
            "",
            f"{http['requests_per_s']:.2f} requests/s over {http['seconds']:,.0f} s, "
            f"{http['errors']} errors; latency p50 {lat['p50']:.0f} ms, p90 {lat['p90']:.0f} ms, "
            f"p99 {lat['p99']:.0f} ms, max {lat['max']:.0f} ms; startup (both workers warmed) "
            f"{http['startup_s']:.0f} s. RSS: {rss}.",
            "",
        ]
    out += percall_table(read_result("percall"))
    out += matmul_table(read_result("matmul"))
    out += peer_table(read_result("peer"))
    out += profile_table(read_result("profile"))
    out += precision_table(read_result("precision"))
    out += int8_table(read_result("int8"))
    out += microbatch_table(read_result("microbatch"))
    out += http_peers_table(read_result("http_peers"))
    return "\n".join(out).rstrip() + "\n"


def percall_table(doc: dict[str, Any] | None) -> list[str]:
    """Median model-call latency at equal one-row shapes (``bench/percall.py``)."""
    if not doc:
        return []
    runs = doc["runs"]
    names = [f"{r['runtime']} {r['precision']}" for r in runs]
    out = [
        f"### Model call at equal shapes (batch 1, median ms; intra-op {doc['intra_op_threads']}; "
        f"{_on(doc)})",
        "",
        "| tokens | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for i, n in enumerate(doc["lengths"]):
        out.append(
            f"| {n} | " + " | ".join(f"{r['rows'][i]['median_ms']:.1f}" for r in runs) + " |"
        )
    out.append("")
    return out


def peer_table(doc: dict[str, Any] | None) -> list[str]:
    """spo's precisions, ONNX Runtime and OpenVINO, interleaved (``bench/peer.py``), each call as a
    share of the measured matmul peak of its precision, and the targets' verdicts."""
    if not doc:
        return []
    from bench.peer import share_table, table, targets

    openvino = doc.get("openvino", "compared")
    out = [
        f"### spo against ONNX Runtime and OpenVINO (median ms per call, {doc['rounds']} interleaved "
        f"rounds of {doc['calls_per_round']} calls; in brackets: speed-up over spo-fp32; intra-op "
        f"{doc['intra_op_threads']}; {_on(doc)})",
        "",
        *([] if openvino == "compared" else [f"OpenVINO not compared: {openvino}.", ""]),
        *table(doc),
        "",
    ]
    shares = share_table(doc)
    if shares:
        out += [
            "Each call as a share of the measured matmul peak of its precision (`python -m bench "
            "matmul`; model FLOPs per token from `bench/rbt6.py`):",
            "",
            *shares,
            "",
        ]
    for name, verdict in targets(doc).items():  # recomputed: the rule may be newer than the run
        ratios = ", ".join(f"{k}: {v:.2f}" for k, v in verdict["ratios"].items())
        mode = f" ({verdict['mode']})" if "mode" in verdict else ""
        others = "".join(
            f"; {other}: " + ", ".join(f"{k}: {v:.2f}" for k, v in ratios_.items())
            for other, ratios_ in verdict.get("others", {}).items()
        )
        what = verdict.get("what", "latency ratio to the peer")
        out.append(
            f"- {name}{mode}: **{'met' if verdict['met'] else 'not met'}** "
            f"({what}: {ratios}{others})"
        )
    out.append("")
    return out


def matmul_table(doc: dict[str, Any] | None) -> list[str]:
    """The measured matmul peak per precision (``bench/matmul.py``)."""
    if not doc:
        return []
    from bench.matmul import table

    return [
        f"### Matmul peak per precision ({doc['engine']}, {doc['threads']} threads, best call of "
        f"{doc['seconds_per_shape']:g} s per shape; {_on(doc)})",
        "",
        *table(doc),
        "",
    ]


def http_peers_table(doc: dict[str, Any] | None) -> list[str]:
    """The same HTTP workload through nginx against each engine (``bench/http_peers.py``)."""
    if not doc:
        return []
    from bench.http_peers import table

    chosen = doc.get("chosen", {})
    wins = ", ".join(f"{s}: {n}" for s, n in chosen.get("wins", {}).items())
    failed = [
        f"- {f['engine']} {f['sizing']}: not measured: {f['error']}" for f in doc.get("failed", [])
    ]
    no_jemalloc = sorted({r["engine"] for r in doc["runs"] if r.get("jemalloc") is False})
    notes = (
        [f"Served without jemalloc (it crashes their workers): {', '.join(no_jemalloc)}."]
        if no_jemalloc
        else []
    )
    return [
        f"### Service-level peers (spo serve --nginx, single-text requests, {doc['seconds_per_run']} s "
        f"per engine, sizing and concurrency; {_on(doc)})",
        "",
        *table(doc),
        "",
        f"Default sizing here: {doc['default_sizing']}; the measurement favours "
        f"{chosen.get('sizing')} (highest requests/s per engine and concurrency: {wins}).",
        *notes,
        *failed,
        "",
    ]


def profile_table(doc: dict[str, Any] | None) -> list[str]:
    """Per-call latency with and without the graph rewrites, and time by op type (``bench/op_profile.py``)."""
    if not doc:
        return []
    from bench.op_profile import table

    return [
        f"### Where a call's time goes: the graph rewrites (median ms per call, {doc['rounds']} "
        f"interleaved rounds of {doc['calls_per_round']} calls; every runtime frozen; in brackets: "
        f"speed-up over the same precision unrewritten; intra-op {doc['intra_op_threads']}; {_on(doc)})",
        "",
        *table(doc),
        "",
    ]


def int8_table(doc: dict[str, Any] | None) -> list[str]:
    """int8 against fp32: speed, memory and quality (``bench/int8.py``)."""
    if not doc:
        return []
    out = [f"### int8 vs fp32 ({_on(doc)}; intra-op {doc['intra_op_threads']})", ""]
    speed = doc.get("speed")
    if speed:
        shapes = list(speed["fp32"]["median_ms"])
        out += [
            "RBT6, one process, interleaved rounds, median ms per model call:",
            "",
            "| batch x length | " + " | ".join(shapes) + " |",
            "|---|" + "---|" * len(shapes),
            "| spo fp32 | "
            + " | ".join(f"{speed['fp32']['median_ms'][k]:.1f}" for k in shapes)
            + " |",
            "| spo int8 | "
            + " | ".join(f"{speed['int8']['median_ms'][k]:.1f}" for k in shapes)
            + " |",
            "| speed-up | " + " | ".join(f"{speed['speedup'][k]:.2f}x" for k in shapes) + " |",
            "",
            f"Single-text requests ({speed['requests']:,} workload texts, alternating blocks): fp32 "
            f"{speed['fp32']['single_text']['texts_per_s']:.1f} texts/s, int8 "
            f"{speed['int8']['single_text']['texts_per_s']:.1f} texts/s "
            f"({speed['speedup']['single_text_texts_per_s']:.2f}x).",
            "",
        ]
    memory = doc.get("memory")
    if memory:
        out += [
            "| RBT6, fresh process | RSS after load + warm-up (MiB) | RSS at end (MiB) | cold start (s) | shapes warmed |",
            "|---|---|---|---|---|",
        ]
        for name, m in memory.items():
            out.append(
                f"| {name} | {m['rss_after_load_mib']:,.0f} | {m['rss_end_mib']:,.0f} | "
                f"{m['cold_start_s']:.1f} | {m['shapes_warmed']} |"
            )
        out.append("")
    quality = doc.get("quality")
    if quality:
        out += [
            "| demo set | texts | F1 fp32 | F1 int8 | F1 delta | texts with identical triples |",
            "|---|---|---|---|---|---|",
        ]
        for name, q in quality.items():
            out.append(
                f"| {name} | {q['records']:,} | {q['baseline']['f1']:.4f} | {q['model']['f1']:.4f} "
                f"| {q['f1_delta']:+.4f} | {q['identical_texts']:,} ({100 * q['identical_share']:.1f}%) |"
            )
        out.append("")
    return out


def precision_table(doc: dict[str, Any] | None) -> list[str]:
    """bf16 vs fp32 on the demo model's evaluation sets (``bench/precision.py``)."""
    if not doc:
        return []
    runs = doc["runs"]
    out = [
        f"### bf16 vs fp32 on the demo model (models/demo; {_on(doc)})",
        "",
        "| set | texts | F1 fp32 | F1 bf16 | texts with identical triples | within tolerance |",
        "|---|---|---|---|---|---|",
    ]
    for name, a in doc["agreement"].items():
        out.append(
            f"| {name} | {a['records']:,} | {a['f1_fp32']:.4f} | {a['f1_bf16']:.4f} "
            f"| {a['identical_texts']:,} | {'yes' if a['within_tolerance'] else 'no'} |"
        )
    fp32, bf16 = runs["fp32"]["single_text"], runs["bf16"]["single_text"]
    out += [
        "",
        f"Single texts ({fp32['texts']}): fp32 {fp32['texts_per_s']:.0f} texts/s, p99 "
        f"{fp32['latency_ms']['p99']:.1f} ms; bf16 {bf16['texts_per_s']:.0f} texts/s, p99 "
        f"{bf16['latency_ms']['p99']:.1f} ms. RSS after load: fp32 "
        f"{runs['fp32']['rss_after_load_mib']:,.0f} MiB, bf16 {runs['bf16']['rss_after_load_mib']:,.0f} MiB. "
        f"Keep bf16 (F1 within {doc['f1_tolerance']} or identical): "
        f"{'yes' if doc['keep_bf16'] else 'no'}.",
        "",
    ]
    return out


def microbatch_table(doc: dict[str, Any] | None) -> list[str]:
    """Lines of the micro-batching table (``bench/results/microbatch.json``); none without a run."""
    if not doc:
        return []
    out = [
        f"### Micro-batching (single-text requests, concurrency {doc['concurrency']}, "
        f"{doc['workers']} gunicorn workers x intra-op {doc['intra_op_threads']} x "
        f"{doc['threads']} threads, at most {doc['max_texts']} texts per call; "
        f"{doc['warmup_s']} s warm-up, then {doc['seconds_asked']} s per configuration; {_on(doc)})",
        "",
        "| SPO_MICROBATCH_WAIT_MS | requests | requests/s | vs off | p50 | p90 | p99 | max | errors "
        "| requests per model call: mean (largest) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    off = next((c for c in doc["configs"] if c["wait_ms"] == 0), None)
    for c in doc["configs"]:
        lat = c["latency_ms"]
        batches = c.get("batches")
        if c["wait_ms"] == 0:
            per_call = "1 (off)"
        elif batches:
            per_call = (
                f"{batches['mean_requests_per_batch']:.2f} ({batches['largest_batch_requests']})"
            )
        else:
            per_call = "-"
        ratio = f"{c['requests_per_s'] / off['requests_per_s']:.2f}x" if off else "-"
        out.append(
            f"| {c['wait_ms'] if c['wait_ms'] else '0 (off)'} | {c['requests']:,} "
            f"| {c['requests_per_s']:.2f} | {ratio} | {lat['p50']:.0f} ms | {lat['p90']:.0f} ms "
            f"| {lat['p99']:.0f} ms | {lat['max']:.0f} ms | {c['errors']} | {per_call} |"
        )
    out.append("")
    return out


def run() -> list[str]:
    made = charts()
    text = tables()
    (RESULTS_DIR / "tables.md").write_text(text, encoding="utf-8")
    if BENCHMARKS_MD.is_file():
        doc = BENCHMARKS_MD.read_text(encoding="utf-8")
        if BEGIN in doc and END in doc:
            head, rest = doc.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            BENCHMARKS_MD.write_text(f"{head}{BEGIN}\n{text}{END}{tail}", encoding="utf-8")
    logger.info("report: %s, tables.md", ", ".join(made))
    return made
