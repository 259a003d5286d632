#!/usr/bin/env bash
# Kernel work per request of redcount-rest and of webdis beside it: system calls, context
# switches and Redis's own system calls per request, counted by perf's tracepoints (counts do
# not move with the machine's load, unlike CPU time on a shared 2-core machine; CPU time is
# printed too, for what it is worth).
#
#   bench/front-syscalls.sh [FRONT_BINARY] [SECONDS]
#
# For INCR and EVALSHA (of a one-line script), 1 and 50 kept-alive connections, wrk drives
# each front for SECONDS (redcount-rest: POST / with a JSON body, as the official clients send;
# webdis: GET /INCR/key, its own form); perf stat counts the front's and Redis's syscalls while
# it runs, divided by the requests wrk saw answered. Needs redis-server, webdis, wrk, perf.
set -euo pipefail
front=${1:-target/release/redcount-rest}
secs=${2:-4}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
rport=$((20000 + RANDOM % 5000)); fport=$((rport + 1)); wport=$((rport + 2))
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
redis-server --port "$rport" --save '' --appendonly no --daemonize yes --logfile "$work/redis.log" --pidfile "$work/redis.pid"
for _ in $(seq 50); do [ -s "$work/redis.pid" ] && break; sleep 0.1; done
sha=$(redis-cli -p "$rport" SCRIPT LOAD "return redis.call('INCR', KEYS[1])")
echo "{\"redis_host\": \"127.0.0.1\", \"redis_port\": $rport, \"http_host\": \"127.0.0.1\", \"http_port\": $wport, \"threads\": 1, \"daemonize\": false, \"database\": 0, \"verbosity\": 0, \"logfile\": \"$work/webdis.log\"}" > "$work/webdis.json"
REDCOUNT_REST_TOKEN=$token "$front" --listen "127.0.0.1:$fport" --redis "redis://127.0.0.1:$rport" --threads 1 --log error >"$work/front.log" 2>&1 &
fpid=$!
webdis "$work/webdis.json" >"$work/webdis.out" 2>&1 &
wpid=$!
for port in $fport $wport; do
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done
for cmd in INCR EVALSHA; do
  body=$([ $cmd = INCR ] && echo '["INCR","bench:x"]' || echo "[\"EVALSHA\",\"$sha\",\"1\",\"bench:x\"]")
  printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Authorization"] = "Bearer %s"\n' "'$body'" "$token" > "$work/$cmd.lua"
done
ev=raw_syscalls:sys_enter,context-switches,task-clock
for cmd in INCR EVALSHA; do
  for c in 1 50; do
    for kind in redcount-rest webdis; do
      if [ $kind = webdis ]; then pid=$wpid; args=("http://127.0.0.1:$wport/$([ $cmd = INCR ] && echo INCR/bench:x || echo "EVALSHA/$sha/1/bench:x")")
      else pid=$fpid; args=(-s "$work/$cmd.lua" "http://127.0.0.1:$fport/"); fi
      perf stat -x, -e "$ev" -p "$pid" -o "$work/front.stat" & sp=$!
      perf stat -x, -e "$ev" -p "$(cat "$work/redis.pid")" -o "$work/redis.stat" & rp=$!
      sleep 0.3
      /usr/bin/time -f "%U %S" -o "$work/wrk.time" wrk -t1 -c$c -d${secs}s "${args[@]}" > "$work/wrk.out"
      kill -INT $sp $rp; wait $sp $rp 2>/dev/null || true
      n=$(awk '/requests in/{print $1}' "$work/wrk.out")
      grep -q Non-2xx "$work/wrk.out" && { echo "$kind $cmd: non-2xx replies"; cat "$work/wrk.out"; exit 1; }
      val() { awk -F, -v e="$2" '$3 ~ e {print $1}' "$1"; }
      awk -v k=$kind -v cmd=$cmd -v c=$c -v n="$n" -v fs="$(val "$work/front.stat" sys_enter)" \
        -v fc="$(val "$work/front.stat" context-switches)" -v ft="$(val "$work/front.stat" task-clock)" \
        -v rs="$(val "$work/redis.stat" sys_enter)" -v wt="$(awk '{print $1 + $2}' "$work/wrk.time")" \
        'BEGIN { printf "%-8s %2d conn %-14s %7d requests: %5.2f syscalls, %5.3f context switches, %4.1f µs CPU; Redis %5.2f syscalls; wrk %4.1f µs CPU (per request)\n", cmd, c, k, n, fs/n, fc/n, ft*1000/n, rs/n, wt*1e6/n }'
    done
  done
done
