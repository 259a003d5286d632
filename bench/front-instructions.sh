#!/usr/bin/env bash
# Instructions per request of redcount-rest, and of webdis beside it, counted by callgrind
# (user space only, deterministic, unlike CPU time on a shared 2-core machine).
#
#   bench/front-instructions.sh [FRONT_BINARY] [REQUESTS]
#
# Each front runs under valgrind twice, from start to exit: once with an 800-request warm-up
# only, once with REQUESTS more; the difference over REQUESTS is its cost per request. The
# requests are INCRs over 8 kept-alive connections (redcount-rest: POST / with a JSON body,
# as the official clients send; webdis: GET /INCR/key, its own form). Needs redis-server,
# valgrind, webdis and python3.
set -euo pipefail
front=${1:-target/release/redcount-rest}
n=${2:-4000}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
rport=$((20000 + RANDOM % 5000)); fport=$((rport + 1))
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
redis-server --port "$rport" --save '' --appendonly no --daemonize yes --logfile "$work/redis.log"
cat > "$work/load.py" <<'PY'
import http.client, sys, threading
n, port, kind, token = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def worker(k):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(k):
        if kind == "rest":
            c.request("POST", "/", body='["INCR","bench:x"]', headers={"Authorization": "Bearer " + token})
        else:
            c.request("GET", "/INCR/bench:x")
        r = c.getresponse(); body = r.read()
        assert r.status == 200, body
threads = [threading.Thread(target=worker, args=(n // 8,)) for _ in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
PY
echo "{\"redis_host\": \"127.0.0.1\", \"redis_port\": $rport, \"http_host\": \"127.0.0.1\", \"http_port\": $fport, \"threads\": 1, \"daemonize\": false, \"database\": 0, \"verbosity\": 0, \"logfile\": \"$work/webdis.log\"}" > "$work/webdis.json"

# Total instructions of one front's whole run with `extra` requests after the warm-up.
run() {
  local kind=$1 extra=$2 out="$work/cg.$1.$2"
  if [ "$kind" = rest ]; then
    REDCOUNT_REST_TOKEN=$token valgrind --tool=callgrind --callgrind-out-file="$out" \
      "$front" --listen "127.0.0.1:$fport" --redis "redis://127.0.0.1:$rport" --threads 1 --log error \
      >"$work/front.log" 2>&1 &
  else
    valgrind --tool=callgrind --callgrind-out-file="$out" webdis "$work/webdis.json" >"$work/front.log" 2>&1 &
  fi
  local pid=$!
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$fport") 2>/dev/null && break
    sleep 0.2
  done
  python3 "$work/load.py" 800 "$fport" "$kind" "$token"
  [ "$extra" -gt 0 ] && python3 "$work/load.py" "$extra" "$fport" "$kind" "$token"
  kill -TERM "$pid"; wait "$pid" || true
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}
for kind in rest webdis; do
  base=$(run "$kind" 0); more=$(run "$kind" "$n")
  echo "$kind: $(((more - base) / n)) instructions per INCR request ($n requests)"
done
