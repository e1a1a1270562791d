#!/usr/bin/env bash
# GuideLLM against calculet (issue #14): the load generator operators point at vLLM, with its default
# OpenAI backend settings (it probes GET /health, sends streamed requests with vLLM's
# stream_options.continuous_usage_stats), a local prompt file, a constant request rate.
#
# GuideLLM pulls in torch (several GB installed), so it lives in a virtual environment of its own,
# never in .venv or pyproject.toml, and this script is not part of `make test`, `make bench` or CI.
# Set it up once (a CPU build of torch first, or pip fetches a multi-GB CUDA build):
#
#     python3.11 -m venv /tmp/guidellm-venv
#     /tmp/guidellm-venv/bin/pip install torch==2.13.0   # the CPU wheel, where one is on hand
#     /tmp/guidellm-venv/bin/pip install guidellm        # measured with 0.8.1
#
# Then:  bash bench/guidellm.sh [rate_per_s] [max_requests]
#
# It starts `python -m calculet.run --port 0` on 127.0.0.1 (the bundled model, tiny cost model),
# runs one constant-rate benchmark over bench/guidellm_prompts.txt, prints GuideLLM's tables and
# the successful / errored / incomplete request counts from its JSON report, stops the server and
# exits non-zero if any request errored.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
GUIDELLM_VENV="${GUIDELLM_VENV:-/tmp/guidellm-venv}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
RATE="${1:-2}"
MAX_REQUESTS="${2:-24}"
WORK="$(mktemp -d /tmp/calculet-guidellm-XXXXXX)"

if [[ ! -x "$GUIDELLM_VENV/bin/guidellm" ]]; then
    echo "guidellm is not installed in $GUIDELLM_VENV; see the set-up steps at the top of $0" >&2
    exit 2
fi

CALCULET_HOME="$WORK/home" "$PYTHON" -m calculet.run --host 127.0.0.1 --port 0 --log-format json \
    >"$WORK/server.out" 2>"$WORK/server.log" &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT

PORT=""
for _ in $(seq 1 600); do  # the listening line names the port (bring-up builds and signs the bundled model)
    PORT="$(sed -n 's/.*"msg":"listening".*"port":\([0-9]*\).*/\1/p' "$WORK/server.log" | head -1)"
    [[ -n "$PORT" ]] && break
    if ! kill -0 "$SERVER" 2>/dev/null; then cat "$WORK/server.log" >&2; exit 2; fi
    sleep 0.1
done
[[ -n "$PORT" ]] || { echo "calculet did not start" >&2; exit 2; }
echo "calculet on http://127.0.0.1:$PORT; GuideLLM $("$GUIDELLM_VENV/bin/pip" show guidellm | sed -n 's/^Version: //p')"

cd "$WORK"
"$GUIDELLM_VENV/bin/guidellm" run \
    --backend "kind=openai_http,target=http://127.0.0.1:$PORT" \
    --profile "kind=constant,rate=$RATE" \
    --constraint "kind=max_requests,count=$MAX_REQUESTS" \
    --data "kind=text_file,path=$HERE/guidellm_prompts.txt" \
    --output "kind=json,path=$WORK/guidellm.json" \
    --disable-console-interactive

"$PYTHON" - "$WORK/guidellm.json" "$WORK/server.log" <<'EOF'
import collections, json, sys
report = json.load(open(sys.argv[1]))
totals = report["benchmarks"][0]["metrics"]["request_totals"]
routes = collections.Counter()
for line in open(sys.argv[2]):
    try:
        record = json.loads(line)
    except ValueError:
        continue
    if record.get("msg") == "http":
        routes[f"{record.get('method')} {record.get('route')} {record.get('status')}"] += 1
print(f"GuideLLM requests: successful {totals['successful']}, errored {totals['errored']}, "
      f"incomplete {totals['incomplete']}, total {totals['total']}")
print("calculet saw: " + ", ".join(f"{k} x{v}" for k, v in sorted(routes.items())))
for request in report["benchmarks"][0]["requests"].get("errored", []):
    print("errored:", request["info"].get("error"))
sys.exit(1 if totals["errored"] else 0)
EOF
