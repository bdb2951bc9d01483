#!/usr/bin/env bash
# Regenerates docs/kv-quantization.md and the README section between
# <!-- kv-quant:begin --> and <!-- kv-quant:end --> from measurements:
#   kvx inspect (bytes/token), kvx eval (PPL, KLD, top-1, copy; baseline f16)
#   on every real model in ../shared/models, kvx perplexity against llama.cpp's
#   q8_0/q4_0 KV caches on the probe model, and (with --speed) kvx bench.
#
# Usage: scripts/kv_quant_report.sh [--kvx build/kvx] [--shared ../shared] [--threads 2]
#                                   [--quick] [--speed | --speed-only] [--render-only]
# Raw results are kept in docs/results/kv_quant/*.json; --render-only rebuilds
# the documents from them without running anything.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec python3 "$here/kv_quant_report.py" "$@"
