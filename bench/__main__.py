"""``python -m bench [all|model|padding|memory|batch|precision|int8|percall|profile|threadplan|matmul|peer|threads|http|http-peers|microbatch|limits|report]``.

With no subcommand (``make bench``) everything runs in order with the issue's counts: 20,000 requests
per runtime and 20,000 HTTP requests, which takes hours on 2 cores; ``--requests`` reduces both.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import time

from bench.runtimes import RUNTIMES

logger = logging.getLogger("bench")

STEPS = (
    "model",
    "padding",
    "memory",
    "batch",
    "precision",
    "int8",
    "percall",
    "profile",
    "threadplan",
    "matmul",
    "peer",
    "threads",
    "http",
    "http-peers",
    "microbatch",
    "limits",
    "report",
)

# Steps that load the cached RBT6 benchmark model and need it built first (``bench.rbt6.build_model``).
# ``profile`` and ``peer`` build it themselves (``peer`` only once ONNX Runtime is there to compare).
NEEDS_RBT6 = frozenset(
    {
        "memory",
        "batch",
        "precision",
        "int8",
        "percall",
        "threads",
        "http",
        "http-peers",
        "microbatch",
        "limits",
    }
)


# The options: flag, type, default, help (each step reads the ones it names).
OPTIONS: tuple[tuple[str, type, object, str], ...] = (
    ("--requests", int, 20_000, "requests per runtime (memory) and for the HTTP soak (default 20000)"),
    ("--runtimes", str, ",".join(RUNTIMES), f"memory run: comma-separated subset of {','.join(RUNTIMES)}"),
    ("--rss-every", int, 500, "RSS sample interval (requests)"),
    ("--intra", int, 2, "intra-op threads (memory, batch)"),
    ("--inter", int, 1, "inter-op threads (memory, batch)"),
    ("--max-seconds", float, 3 * 3600, "time bound per memory runtime and for the HTTP soak"),
    ("--batch-seconds", float, 5.0, "seconds per batch size"),
    ("--batch-texts", int, 256, "texts for end-to-end batches"),
    ("--thread-requests", int, 150, "requests per worker"),
    ("--concurrency", int, 4, "HTTP soak connections"),
    ("--seconds", int, 150, "microbatch: measured seconds per configuration (--requests also bounds it)"),
    ("--microbatch-waits", str, "0,5", "microbatch: comma-separated SPO_MICROBATCH_WAIT_MS values (0 = off, the baseline)"),
    ("--microbatch-workers", int, 2, "microbatch: gunicorn workers"),
    ("--peer-texts", int, 600, "peer: workload texts per runtime"),
    ("--peer-rounds", int, 2, "peer: interleaved per-call rounds"),
    ("--matmul-seconds", float, 1.0, "matmul: seconds per shape and precision"),
    ("--http-seconds", int, 15, "http-peers: seconds per engine, sizing and concurrency"),
    ("--http-concurrency", str, "1,4,16", "http-peers: comma-separated wrk connection counts"),
    ("--http-engines", str, "tf-fp32,tf-int8,onnx,ov-int8,ov-default", "http-peers: comma-separated engines"),
    ("--http-sizings", str, "1x2,2x1", "http-peers: comma-separated WORKERSxTHREADS sizings"),
    ("--worst-texts", int, None, "limits: run only this many texts of the worst-case request (the rest extrapolated)"),
    ("--limits-repeats", int, 3, "limits: timed runs per per-token size"),
)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("step", nargs="?", default="all", choices=("all", *STEPS))
    for flag, kind, default, text in OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cached RBT6 model")
    args = parser.parse_args(argv)  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    steps = STEPS if args.step == "all" else (args.step,)
    for step in steps:
        started = time.perf_counter()
        logger.info("step %s", step)
        try:
            _run_step(step, args, parser)
        except subprocess.CalledProcessError as exc:
            # A worker process failed: its own output (traceback included) is above; say which.
            parser.exit(1, f"python -m bench {step}: {' '.join(map(str, exc.cmd[2:4]))} failed "
                           f"(exit status {exc.returncode}); its output is above\n")  # fmt: skip
        logger.info("step %s done in %.0fs", step, time.perf_counter() - started)


def _run_step(step: str, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """One step, with the options it reads."""
    if step in NEEDS_RBT6:
        from bench.rbt6 import build_model

        build_model()  # a fresh checkout has none cached yet; a no-op once it has
    if step == "model":
        from bench.rbt6 import build_int8, build_model

        logger.info("model dirs: %s", build_model(force=args.rebuild))
        logger.info("int8 model: %s", build_int8(force=args.rebuild))
    elif step == "padding":
        from bench import padding

        padding.run()
    elif step == "memory":
        from bench import memory

        runtimes = tuple(r for r in args.runtimes.split(",") if r)
        unknown = set(runtimes) - set(RUNTIMES)
        if unknown:
            parser.error(f"unknown runtimes: {', '.join(sorted(unknown))}")
        memory.run(args.requests, runtimes=runtimes, intra=args.intra, inter=args.inter,
                   rss_every=args.rss_every, max_seconds=args.max_seconds)  # fmt: skip
        if args.step == "memory":
            from bench import padding

            padding.run()  # its warm-up estimate scales the measured spo warm-up
    elif step == "batch":
        from bench import batch

        batch.run(intra=args.intra, inter=args.inter, seconds=args.batch_seconds,
                  texts=args.batch_texts)  # fmt: skip
    elif step == "precision":
        from bench import precision

        precision.run(intra=args.intra, inter=args.inter)
    elif step == "int8":
        from bench import int8

        int8.run(intra=args.intra, inter=args.inter, requests=min(args.requests, 1000))
    elif step == "percall":
        from bench import percall

        percall.run(intra=args.intra, inter=args.inter)
    elif step == "profile":
        from bench import op_profile

        op_profile.run(intra=args.intra, inter=args.inter)
    elif step == "threadplan":
        from bench import threadplan

        threadplan.run(intra=args.intra)
    elif step == "peer":
        from bench import peer

        peer.run(intra=args.intra, inter=args.inter, texts=args.peer_texts, rounds=args.peer_rounds)
    elif step == "matmul":
        from bench import matmul

        matmul.run(threads=args.intra, seconds=args.matmul_seconds)
    elif step == "http-peers":
        from bench import http_peers

        engines = tuple(e for e in args.http_engines.split(",") if e)
        unknown = set(engines) - set(http_peers.ENGINES)
        if unknown:
            parser.error(f"--http-engines: unknown {', '.join(sorted(unknown))}; "
                         f"one of {','.join(http_peers.ENGINES)}")  # fmt: skip
        sizings = tuple(s for s in args.http_sizings.split(",") if s)
        try:
            concurrency = tuple(int(c) for c in args.http_concurrency.split(",") if c.strip())
            for s in sizings:
                http_peers.parse_sizing(s)
        except ValueError as exc:
            parser.error(f"--http-concurrency / --http-sizings: {exc}")
        if not concurrency or min(concurrency) < 1:
            parser.error("--http-concurrency: positive integers")
        http_peers.run(engines=engines, sizings=sizings, concurrency=concurrency,
                       seconds=args.http_seconds)  # fmt: skip
    elif step == "threads":
        from bench import threads

        threads.run(args.thread_requests)
    elif step == "http":
        from bench import http_load

        http_load.run(args.requests, concurrency=args.concurrency,
                 max_seconds=int(args.max_seconds))  # fmt: skip
    elif step == "microbatch":
        from bench import microbatch

        try:
            waits = tuple(int(w) for w in args.microbatch_waits.split(",") if w.strip())
        except ValueError:
            parser.error(f"--microbatch-waits: integers, got {args.microbatch_waits!r}")
        microbatch.run(args.seconds, args.requests, waits_ms=waits,
                       workers=args.microbatch_workers)  # fmt: skip
    elif step == "limits":
        from bench import limits

        limits.run(repeats=args.limits_repeats, worst_texts=args.worst_texts)
    elif step == "report":
        from bench import report

        report.run()


if __name__ == "__main__":
    main()
