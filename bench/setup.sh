#!/usr/bin/env bash
# System tools the benchmarks need (Debian): wrk (HTTP load generator), libjemalloc2 (allocator
# preloaded for the spo-jemalloc runtime and by `spo serve`) and nginx-light (`spo serve --nginx`, the
# http-peers step). Idempotent; needs root or sudo.
set -euo pipefail
need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
[ -f /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] || need+=(libjemalloc2)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
if [ ${#need[@]} -eq 0 ]; then
    echo "bench/setup.sh: wrk, libjemalloc2 and nginx already installed"
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "bench/setup.sh: installing ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
