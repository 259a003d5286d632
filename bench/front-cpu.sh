#!/usr/bin/env bash
# Whole CPU per request (user + kernel) of redcount-rest binaries and of webdis beside them,
# in interleaved rounds (the machine is shared: its speed drifts, so every round runs each
# front in turn and the ratios are read round by round).
#
#   bench/front-cpu.sh ROUNDS SECONDS CONNECTIONS INCR|EVALSHA FRONT_BINARY...
#
# One Redis, webdis (Debian's package, one thread) and each FRONT_BINARY (--threads 1) before
# it; wrk (one thread, CONNECTIONS kept-alive connections) drives each for SECONDS in turn:
# redcount-rest with POST / and a JSON body, as the official clients send, webdis with its own
# GET /INCR/key form. The front process's CPU is perf's task-clock while wrk runs (user and
# kernel), and its user and kernel shares from /proc (10 ms ticks), divided by the requests wrk
# saw answered. Needs redis-server, webdis, wrk, perf.
set -euo pipefail
rounds=$1 secs=$2 conns=$3 cmd=$4
shift 4
work=$(mktemp -d)
rport=$((20000 + RANDOM % 5000)); wport=$((rport + 1))
trap 'kill $(jobs -p) 2>/dev/null; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
redis-server --port "$rport" --save '' --appendonly no --daemonize yes --logfile "$work/redis.log" --pidfile "$work/redis.pid"
for _ in $(seq 50); do [ -s "$work/redis.pid" ] && break; sleep 0.1; done
sha=$(redis-cli -p "$rport" SCRIPT LOAD "return redis.call('INCR', KEYS[1])")
echo "{\"redis_host\": \"127.0.0.1\", \"redis_port\": $rport, \"http_host\": \"127.0.0.1\", \"http_port\": $wport, \"threads\": 1, \"daemonize\": false, \"database\": 0, \"verbosity\": 0, \"logfile\": \"$work/webdis.log\"}" > "$work/webdis.json"
webdis "$work/webdis.json" >"$work/webdis.out" 2>&1 &
pids=($!); names=(webdis); ports=($wport)
i=0
for f in "$@"; do
  i=$((i + 1)); p=$((wport + i))
  REDCOUNT_REST_TOKEN=$token "$f" --listen "127.0.0.1:$p" --redis "redis://127.0.0.1:$rport" --threads 1 --log error >"$work/front$i.log" 2>&1 &
  pids+=($!); names+=("$f"); ports+=($p)
done
for p in "${ports[@]}"; do
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.1; done
done
body=$([ "$cmd" = INCR ] && echo '["INCR","bench:x"]' || echo "[\"EVALSHA\",\"$sha\",\"1\",\"bench:x\"]")
printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Authorization"] = "Bearer %s"\n' "'$body'" "$token" > "$work/req.lua"
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
for r in $(seq "$rounds"); do
  for k in "${!pids[@]}"; do
    pid=${pids[$k]}; port=${ports[$k]}
    if [ "$k" = 0 ]; then args=("http://127.0.0.1:$port/$([ "$cmd" = INCR ] && echo INCR/bench:x || echo "EVALSHA/$sha/1/bench:x")")
    else args=(-s "$work/req.lua" "http://127.0.0.1:$port/"); fi
    perf stat -x, -e task-clock -p "$pid" -o "$work/stat" & sp=$!
    sleep 0.2
    read -r u0 s0 < <(ticks "$pid")
    wrk -t1 -c"$conns" -d"${secs}s" "${args[@]}" > "$work/wrk.out"
    read -r u1 s1 < <(ticks "$pid")
    kill -INT $sp; wait $sp 2>/dev/null || true
    n=$(awk '/requests in/{print $1}' "$work/wrk.out")
    grep -q Non-2xx "$work/wrk.out" && { echo "${names[$k]}: non-2xx replies"; cat "$work/wrk.out"; exit 1; }
    tc=$(awk -F, '$3 ~ /task-clock/ {print $1}' "$work/stat")
    awk -v r="$r" -v k="${names[$k]}" -v n="$n" -v tc="$tc" -v s="$secs" -v u=$((u1 - u0)) -v sy=$((s1 - s0)) -v c="$cmd" \
      'BEGIN { printf "round %d %-7s %-34s %6.0f req/s %6.2f µs CPU per request (user %2.0f%%)\n", r, c, k, n / s, tc * 1000 / n, (u + sy) ? 100 * u / (u + sy) : 0 }'
  done
done
