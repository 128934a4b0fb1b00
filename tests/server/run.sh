#!/usr/bin/env bash
# End-to-end tests of `sluice serve` on loopback: curl basics, the official `openai` npm client,
# a malformed-request battery, disconnect cancellation, 503 backpressure, a bounded load test
# with RSS before/after, and clean shutdown (exit 0; under ASan also no leaks).
#
# usage: run.sh SLUICE_BINARY SOURCE_DIR WORK_DIR [SANITIZED(0|1) [TEST_SERVER_TEXT_BINARY]]
# (the last writes a model with a chat template, for the thinking switch)
# Servers listen on ephemeral ports (--port 0) and are stopped by the EXIT trap on any failure.
# SLUICE_SKIP_NODE=1 skips the npm client part (for machines without a registry).
set -euo pipefail

BIN=$1 SRC=$2 WORK=$3 SAN=${4:-0} UNIT=${5:-}
mkdir -p "$WORK"
QWEN=$SRC/tests/data/qwen3moe-tiny-Q4_K_M.gguf
STORIES=$SRC/models/stories260K.gguf # named, not the embedded default, which may change
LOAD_CLIENTS=8 LOAD_REQUESTS=50
# the load test allows this much RSS growth: ASan keeps freed memory in quarantine
if [ "$SAN" = 1 ]; then RSS_SLACK_KB=65536; else RSS_SLACK_KB=8192; fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:quarantine_size_mb=32"

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
# any command failing outside fail() still says where
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND (exit $?)" >&2' ERR

NAMES=()
fail() {
  echo "FAIL: $*" >&2
  local n pid_var rc
  for n in "${NAMES[@]}"; do
    pid_var="PID_$n"
    if kill -0 "${!pid_var}" 2>/dev/null; then
      echo "--- server $n: running" >&2
    else
      rc=0
      wait "${!pid_var}" 2>/dev/null || rc=$?
      echo "--- server $n: gone (exit status $rc)" >&2
    fi
    tail -n 20 "$WORK/$n.log" >&2
  done
  exit 1
}
pass() { echo "ok   $*"; }

# start_server NAME ARGS... : sets URL_<NAME> and PID_<NAME>
start_server() {
  local name=$1
  shift
  local log=$WORK/$name.log
  : >"$log" # exists before the poll below: the background job opens it only once it runs
  "$BIN" serve --port 0 -t 1 "$@" >"$log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  NAMES+=("$name")
  local port="" i
  for i in $(seq 1 300); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "server $name exited at start"
    sleep 0.1
  done
  [ -n "$port" ] || fail "server $name did not start"
  printf -v "URL_$name" 'http://127.0.0.1:%s' "$port"
  printf -v "PID_$name" '%s' "$pid"
}

# stop_server NAME : SIGTERM, expect exit 0 within 20 s (an ASan leak report exits non-zero)
stop_server() {
  local name=$1 pid_var="PID_$1"
  local pid=${!pid_var}
  kill -TERM "$pid"
  local i
  for i in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "server $name did not stop within 20 s"
  local rc=0
  wait "$pid" || rc=$?
  [ "$rc" = 0 ] || fail "server $name exited with $rc"
  grep -q "ERROR: \(AddressSanitizer\|LeakSanitizer\)\|runtime error:" "$WORK/$name.log" &&
    fail "sanitizer report in $name.log"
  pass "server $name stopped cleanly"
}

# expect CODE METHOD URL [curl args...]: the status, and an OpenAI error object for 4xx/5xx
expect() {
  local want=$1 method=$2 url=$3
  shift 3
  local code how=(-X "$method")
  [ "$method" = HEAD ] && how=(-I) # -X HEAD would wait for a body
  code=$(curl -s -o "$WORK/body" -w '%{http_code}' "${how[@]}" "$url" "$@" || true)
  [ "$code" = "$want" ] || fail "$method $url $*: got $code, want $want: $(head -c 300 "$WORK/body")"
  if [ "$want" -ge 400 ] && [ "$method" != HEAD ]; then
    grep -q '^{"error":{"message":"[^"]*.*"type":"[a-z_]*","param":.*"code":' "$WORK/body" ||
      fail "$method $url: not an OpenAI error object: $(head -c 300 "$WORK/body")"
  fi
}

alive() {
  local url_var="URL_$1"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "${!url_var}/health")" = 200 ] ||
    fail "server $1 is not answering /health"
}

metric() { # metric NAME_URL METRIC
  curl -s "$1/metrics" | sed -n "s/^$2 \([0-9.e+-]*\)$/\1/p"
}

rss_kb() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }

start_server stories -m "$STORIES" -c 512 --max-body 1M --max-tokens 64
start_server chatml -m "$QWEN"
start_server slow -m "$STORIES" --queue 0 --debug-delay-ms 20 -c 512
S=$URL_stories

# ---- curl basics ----------------------------------------------------------------------
expect 200 GET "$S/health"
expect 200 GET "$S/v1/models"
grep -q '"object":"list"' "$WORK/body" || fail "/v1/models: $(cat "$WORK/body")"
expect 200 HEAD "$S/v1/models"
expect 200 POST "$S/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}'
grep -q '"finish_reason":"length".*"usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}' "$WORK/body" ||
  fail "completion: $(cat "$WORK/body")"
expect 200 POST "$S/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":8,"stream":true}'
grep -q '^data: {"id":"chatcmpl-' "$WORK/body" && [ "$(grep -v '^$' "$WORK/body" | tail -n 1)" = 'data: [DONE]' ] ||
  fail "SSE stream: $(cat "$WORK/body")"
curl -s -D "$WORK/headers" -o /dev/null "$S/v1/completions" -d '{"prompt":"a","max_tokens":2,"stream":true}'
grep -qi '^content-type: text/event-stream' "$WORK/headers" || fail "stream content type: $(cat "$WORK/headers")"
expect 200 POST "$S/v1/completions" -d '{"prompt":"","max_tokens":4}' # starts from BOS
expect 200 POST "$S/v1/completions" -d '{"prompt":[1, 403, 407],"max_tokens":4}'
curl -s "$S/metrics" >"$WORK/metrics"
for m in sluice_requests_total sluice_queue_depth sluice_time_to_first_token_seconds_bucket \
  sluice_generation_tokens_per_second sluice_expert_cache_hit_ratio sluice_expert_bytes_read_total; do
  grep -q "^$m" "$WORK/metrics" || fail "/metrics lacks $m"
done
grep -q '^# TYPE sluice_time_to_first_token_seconds histogram' "$WORK/metrics" || fail "histogram type"
pass "curl: health, models, completions, chat, SSE, metrics"

# ---- malformed requests: each gets its 4xx and the server stays up ----------------------
C=$S/v1/chat/completions P=$S/v1/completions
MSG='"messages":[{"role":"user","content":"hi"}]'
bad_chat=(
  '{' '' '[]' '"str"' 'null' '123' '{"messages":"hi"}' '{"messages":[]}' '{"messages":["x"]}'
  '{"messages":[{"role":"wizard","content":"x"}]}' '{"messages":[{"content":"x"}]}'
  '{"messages":[{"role":"user"}]}' '{"messages":[{"role":"user","content":5}]}'
  '{"messages":[{"role":7,"content":"x"}]}'
  '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}'
  '{"messages":[{"role":"user","content":[{"type":"text"}]}]}'
  "{$MSG,\"max_tokens\":-1}" "{$MSG,\"max_tokens\":0}" "{$MSG,\"max_tokens\":\"5\"}"
  "{$MSG,\"max_tokens\":1.5}" "{$MSG,\"max_tokens\":99999999999999999999999}"
  "{$MSG,\"max_tokens\":1e400}" "{$MSG,\"max_tokens\":4294967296}"
  "{$MSG,\"temperature\":2.5}" "{$MSG,\"temperature\":-0.1}" "{$MSG,\"temperature\":\"hot\"}"
  "{$MSG,\"top_p\":1.5}" "{$MSG,\"top_k\":-1}" "{$MSG,\"stream\":\"yes\"}" "{$MSG,\"stream_options\":1}"
  "{$MSG,\"stop\":5}" "{$MSG,\"stop\":[1]}" "{$MSG,\"stop\":\"\"}"
  "{$MSG,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}"
  "{$MSG,\"n\":2}" "{$MSG,\"seed\":\"x\"}" "{$MSG,\"seed\":1.5}" "{$MSG,\"logprobs\":true}"
  "{$MSG,\"tools\":[{\"type\":\"function\"}]}" "{$MSG,\"chat_template_kwargs\":5}"
  "{$MSG,\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}" "{$MSG,\"model\":5}"
  '{"messages":[{"role":"user","content":"\u0000"}]}' '{"messages":[{"role":"user","content":"\ud800"}]}'
  '{"messages":[{"role":"user","content":"x"}]} trailing'
)
for b in "${bad_chat[@]}"; do expect 400 POST "$C" --data-binary "$b"; done
bad_completion=('{}' '{"prompt":5}' '{"prompt":[]}' '{"prompt":[1,"a"]}' '{"prompt":[-1]}'
  '{"prompt":[99999999]}' '{"prompt":["a","b"]}' '{"prompt":[[1],[2]]}' '{"prompt":null}'
  '{"prompt":"x","echo":true}' '{"prompt":"x","best_of":3}' '{"prompt":"x","suffix":"y"}')
for b in "${bad_completion[@]}"; do expect 400 POST "$P" --data-binary "$b"; done
# bytes that are not UTF-8, inside and outside strings
printf '{"messages":[{"role":"user","content":"\xff\xfe"}]}' >"$WORK/bad-utf8"
expect 400 POST "$C" --data-binary @"$WORK/bad-utf8"
printf '\xc3\x28{"prompt":"x"}' >"$WORK/bad-utf8-2"
expect 400 POST "$P" --data-binary @"$WORK/bad-utf8-2"
# nesting beyond the parser's depth limit
head -c 100000 /dev/zero | tr '\0' '[' >"$WORK/deep"
expect 400 POST "$P" --data-binary @"$WORK/deep"
# a prompt longer than the context (-c 512) is refused before any work
{ printf '{"prompt":"'; for i in $(seq 1 700); do printf 'word '; done; printf '"}'; } >"$WORK/long"
expect 400 POST "$P" --data-binary @"$WORK/long"
grep -q '"code":"context_length_exceeded"' "$WORK/body" || fail "long prompt: $(cat "$WORK/body")"
# bodies over --max-body (1 MiB): declared, and chunked (length unknown up front)
head -c 3000000 /dev/zero | tr '\0' 'a' >"$WORK/huge"
expect 413 POST "$P" --data-binary @"$WORK/huge"
expect 413 POST "$P" -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/huge"
# wrong methods and unknown paths
expect 405 GET "$C"
expect 405 PUT "$P" -d '{}'
expect 405 POST "$S/v1/models" -d '{}'
expect 405 DELETE "$S/health"
expect 405 POST "$S/metrics"
expect 404 GET "$S/"
expect 404 GET "$S/nope"
expect 404 POST "$S/v1/chat/completions/extra" -d '{}'
expect 404 GET "$S/v1/models/some-model"
# broken HTTP from a raw socket: libmicrohttpd answers or closes; the server must survive
raw() ( # a subshell: the server may close while we write, and SIGPIPE must not end the script
  trap '' PIPE
  exec 3<>"/dev/tcp/127.0.0.1/${S##*:}" || exit 0
  printf '%b' "$1" >&3 2>/dev/null || true
  timeout 2 cat <&3 >/dev/null 2>&1 || true
)
raw 'GARBAGE\r\n\r\n'
raw 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}'
raw 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt":'
raw "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: $(head -c 100000 /dev/zero | tr '\0' 'b')\r\n\r\n"
raw '\x00\x01\x02\xff\r\n\r\n'
alive stories
n_bad=$((${#bad_chat[@]} + ${#bad_completion[@]} + 20))
pass "malformed requests: $n_bad cases answered with 4xx, server alive"

# ---- the official openai npm client -----------------------------------------------------
if [ "${SLUICE_SKIP_NODE:-0}" = 1 ]; then
  echo "skip openai client tests (SLUICE_SKIP_NODE=1)"
else
  command -v node >/dev/null && command -v npm >/dev/null ||
    fail "node and npm are needed (scripts/deps.sh installs them; SLUICE_SKIP_NODE=1 skips)"
  NODE_DIR=$WORK/node
  if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ]; then
    mkdir -p "$NODE_DIR"
    echo "installing the openai npm package into $NODE_DIR"
    npm install --prefix "$NODE_DIR" --no-audit --no-fund --no-save --loglevel=error 'openai@^6' ||
      fail "npm install openai failed (SLUICE_SKIP_NODE=1 skips this part)"
  fi
  NODE_PATH=$NODE_DIR/node_modules node "$SRC/tests/server/openai_test.cjs" "$URL_stories" "$URL_chatml" ||
    fail "openai client tests"
  pass "openai npm client ($(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$NODE_DIR/node_modules/openai/package.json"))"
  node "$SRC/tests/server/mutate_requests.cjs" "$URL_stories" 300 || fail "mutated requests"
  alive stories
  pass "mutated requests"
fi

# ---- thinking on/off with a Qwen3-style template ---------------------------------------
if [ -n "$UNIT" ]; then
  "$UNIT" --write-template-model "$WORK/qwen3-template.gguf" || fail "writing the template model"
  start_server think -m "$WORK/qwen3-template.gguf"
  start_server nothink -m "$WORK/qwen3-template.gguf" --no-thinking
  grep -q 'chat format chatml, thinking optional (off: empty think block)' "$WORK/think.log" ||
    fail "template not recognized: $(head -n 1 "$WORK/think.log")"
  prompt_tokens() { # URL EXTRA_FIELDS
    { curl -s "$1/v1/chat/completions" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1$2}" || true; } |
      sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p'
  }
  off_kw=',"chat_template_kwargs":{"enable_thinking":false}'
  on_kw=',"chat_template_kwargs":{"enable_thinking":true}'
  on=$(prompt_tokens "$URL_think" "") off=$(prompt_tokens "$URL_think" "$off_kw")
  def_off=$(prompt_tokens "$URL_nothink" "") on2=$(prompt_tokens "$URL_nothink" "$on_kw")
  [ -n "$on" ] && [ -n "$off" ] && [ "$off" -gt "$on" ] && [ "$def_off" = "$off" ] && [ "$on2" = "$on" ] ||
    fail "thinking switch: prompt tokens on=$on off=$off --no-thinking=$def_off, then on=$on2"
  stop_server think
  stop_server nothink
  pass "thinking switch: chat_template_kwargs.enable_thinking and --no-thinking ($on vs $off prompt tokens)"
fi

# ---- disconnects cancel generation; a full queue answers 503 ------------------------------
L=$URL_slow
LONG='{"prompt":"Once upon a time","max_tokens":400,"ignore_eos":true'
# 400 tokens x 20 ms would take 8 s; the client leaves after 1 s
curl -s -N -m 1 "$L/v1/completions" -d "$LONG,\"stream\":true}" >/dev/null || true
for i in $(seq 1 50); do [ "$(metric "$L" sluice_requests_cancelled_total)" = 1 ] && break; sleep 0.1; done
[ "$(metric "$L" sluice_requests_cancelled_total)" = 1 ] || fail "streamed request not cancelled on disconnect"
[ "$(metric "$L" sluice_requests_processing)" = 0 ] || fail "engine still busy after a disconnect"
curl -s -m 1 "$L/v1/completions" -d "$LONG}" >/dev/null || true
for i in $(seq 1 50); do [ "$(metric "$L" sluice_requests_cancelled_total)" = 2 ] && break; sleep 0.1; done
[ "$(metric "$L" sluice_requests_cancelled_total)" = 2 ] || fail "plain request not cancelled on disconnect"
pass "client disconnects cancel generation (streamed and plain)"
curl -s -m 20 "$L/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":60,"ignore_eos":true}' >/dev/null &
BG=$!
for i in $(seq 1 50); do [ "$(metric "$L" sluice_requests_processing)" = 1 ] && break; sleep 0.1; done
code=$(curl -s -D "$WORK/headers" -o "$WORK/body" -w '%{http_code}' "$L/v1/completions" -d '{"prompt":"x","max_tokens":2}')
[ "$code" = 503 ] || fail "queue 0 while busy: got $code"
grep -qi '^retry-after: [0-9]' "$WORK/headers" || fail "503 without Retry-After"
grep -q '"type":"server_error"' "$WORK/body" || fail "503 body: $(cat "$WORK/body")"
wait "$BG" || fail "the request that filled the queue failed"
pass "a full queue answers 503 with Retry-After"
# shutdown in the middle of a generation: the server still exits cleanly
curl -s -N -m 20 "$L/v1/completions" -d "$LONG,\"stream\":true}" >/dev/null &
BG=$!
for i in $(seq 1 50); do [ "$(metric "$L" sluice_requests_processing)" = 1 ] && break; sleep 0.1; done
stop_server slow
wait "$BG" || true

# ---- load: 8 clients x 50 requests; only 200 and 503 allowed; RSS stays flat --------------
load_client() { # id count [long]
  local k code body
  for k in $(seq 1 "$2"); do
    if [ -n "${3:-}" ]; then # a request that holds the worker for tens of milliseconds
      body='{"prompt":"Once upon a time","max_tokens":400,"ignore_eos":true}'
      code=$(curl -s -o /dev/null -w '%{http_code}' "$S/v1/completions" -d "$body" || true)
      echo "$code"
      continue
    fi
    case $((k % 3)) in
      0) body='{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":8}'
         code=$(curl -s -o /dev/null -w '%{http_code}' "$S/v1/chat/completions" -d "$body" || true) ;;
      1) body='{"prompt":"The little dog","max_tokens":8,"stream":true}'
         code=$(curl -s -N -o /dev/null -w '%{http_code}' "$S/v1/completions" -d "$body" || true) ;;
      2) body='{"prompt":"Lily saw a bird","max_tokens":8,"stop":["."]}'
         code=$(curl -s -o /dev/null -w '%{http_code}' "$S/v1/completions" -d "$body" || true) ;;
    esac
    echo "$code"
  done >"$WORK/load-$1.codes"
}
run_load() { # clients requests [long]
  local c pids=()
  for c in $(seq 1 "$1"); do load_client "$c" "$2" "${3:-}" & pids+=($!); done
  for c in "${pids[@]}"; do wait "$c"; done
}
run_load "$LOAD_CLIENTS" 10 # warm-up: allocator arenas, caches
rss0=$(rss_kb "$PID_stories")
t0=$(date +%s.%N)
run_load "$LOAD_CLIENTS" "$LOAD_REQUESTS"
t1=$(date +%s.%N)
rss1=$(rss_kb "$PID_stories")
read -r total ok busy < <(cat "$WORK"/load-*.codes |
  awk '$1 == 200 {o++} $1 == 503 {b++} END {print NR, o + 0, b + 0}')
other=$((total - ok - busy))
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
echo "load: $LOAD_CLIENTS clients x $LOAD_REQUESTS requests = $total in ${secs}s: $ok x 200, $busy x 503, $other other"
echo "load: VmRSS before ${rss0} kB, after ${rss1} kB (growth $((rss1 - rss0)) kB, allowed $RSS_SLACK_KB kB)"
[ "$total" = $((LOAD_CLIENTS * LOAD_REQUESTS)) ] || fail "load: $total responses"
[ "$other" = 0 ] || fail "load: $other responses other than 200/503: $(sort "$WORK"/load-*.codes | uniq -c | tr '\n' ' ')"
[ $((rss1 - rss0)) -le "$RSS_SLACK_KB" ] || fail "load: RSS grew from $rss0 to $rss1 kB"
alive stories
pass "load test"
# the same clients against a queue of 2: the overflow must be clean 503s, nothing else. Long
# requests (400 tokens each): with 8-token ones a 2-core machine running the curls one after
# the other never had more than three in flight, and no 503 came (a CI run failed so)
start_server tight -m "$STORIES" --queue 2 -c 512
S=$URL_tight
run_load "$LOAD_CLIENTS" 10 long
read -r total ok busy < <(cat "$WORK"/load-*.codes |
  awk '$1 == 200 {o++} $1 == 503 {b++} END {print NR, o + 0, b + 0}')
echo "load, --queue 2: $total requests: $ok x 200, $busy x 503, $((total - ok - busy)) other"
[ $((ok + busy)) = "$total" ] && [ "$ok" -gt 0 ] && [ "$busy" -gt 0 ] ||
  fail "load with --queue 2: $(sort "$WORK"/load-*.codes | uniq -c | tr '\n' ' ')"
[ "$(metric "$S" sluice_requests_rejected_total)" = "$busy" ] || fail "rejected_total != 503s"
alive tight
stop_server tight
pass "overload answers 503 only"

stop_server stories
stop_server chatml
PIDS=()
echo "== server tests passed"
