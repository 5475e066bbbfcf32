#!/usr/bin/env bash
# System tools the benchmarks need (Debian): wrk (HTTP load generator) and libjemalloc2 (allocator
# preloaded for the spo-jemalloc runtime and by `spo serve`). Idempotent; needs root or sudo.
set -euo pipefail
need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
[ -f /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] || need+=(libjemalloc2)
if [ ${#need[@]} -eq 0 ]; then
    echo "bench/setup.sh: wrk and libjemalloc2 already installed"
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "bench/setup.sh: installing ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
