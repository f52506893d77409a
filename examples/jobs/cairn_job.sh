#!/usr/bin/env bash
# A template: copy it and adapt these lines (sbatch reads them up to the first command).
# Server nodes first (CAIRN_SERVERS + CAIRN_SPARES of them), the application on the others;
# USR1 reaches this script 300 s (CAIRN_HALT_SECONDS) before the time limit.
#SBATCH --job-name=cairn
#SBATCH --nodes=6
#SBATCH --exclusive
#SBATCH --time=02:00:00
#SBATCH --signal=B:USR1@300
#
# A multi-node job that stages through Cairn: CAIRN_SERVERS staging servers on nodes of their own,
# the application on the others, then a drain to disk (when the cluster has one) and a stop.
#
#   sbatch examples/jobs/cairn_job.sh ./my_simulation args...               # Slurm: servers on the first nodes
#   LAUNCH_SERVER="mpirun -n 1 --host {node}" SERVER_NODES="n1 n2" LAUNCH_APP="mpirun -n 16 --hostfile app.hosts -x CAIRN_CONFIG \
#     -x CAIRN_HALT_FILE -x CAIRN_HALT_SECONDS" examples/jobs/cairn_job.sh ./my_simulation args...   # mpirun
#
# Settings (environment; {i} is the server's index, {node} its entry in SERVER_NODES):
#   CAIRN_SERVERS        servers (default 2)            CAIRN_SPARES   spare servers, ids after them (default 0)
#   CAIRN_MEMORY         memory per server (default 4GiB)
#   CAIRN_CLUSTER        cluster file, on a file system every node sees (default $PWD/cluster.json)
#   CAIRN_REDUNDANCY, CAIRN_DRAIN, CAIRN_DRAIN_EVERY, CAIRN_PREFAULT
#                        the servers' --redundancy, --drain, --drain-every, --prefault (default: the
#                        user's cairn.toml [staging], else the servers' defaults)
#   CAIRN_SERVER_ARGS    more `cairn serve` flags, e.g. "--failure-timeout 5s --rack r{i}"
#   CAIRN_IFACE          the network servers listen on, e.g. ib0 (its first IPv4 address)
#   CAIRN_START_TIMEOUT  seconds for the cluster to form, and for an old cluster file's servers to
#                        answer before this job takes it over (default 120)
#   CAIRN_HALT_FILE      created on SIGUSR1: cairn.halt_requested() turns true (default: $CAIRN_CLUSTER.halt)
#   CAIRN_HALT_SECONDS   cairn.halt_requested() also turns true this close to $SLURM_JOB_END_TIME (default 300)
#   CAIRN_DRAIN_TIMEOUT  seconds the final drain may take (default: until 30 s before $SLURM_JOB_END_TIME)
#   CAIRN_TRANSPORT      how the application reaches the servers: tcp (default), auto or socket
#   LAUNCH_SERVER        runs a command on server {i}'s node (default: srun --nodes=1 --ntasks=1 --exclusive --relative={i})
#   SERVER_HOST          prints the address server {i} listens on, run on its node (default: CAIRN_IFACE's
#                        address, else `hostname -i` unless loopback, else the first of `hostname -I`)
#   SERVER_NODE          prints its node name for placement, run on its node (default: hostname)
#   LAUNCH_APP           runs the application (default: srun on the nodes after the servers')
#   PYTHON               the Python with Cairn installed (default: python3)
# The application finds the cluster through $CAIRN_CONFIG: the user's cairn.toml ($CAIRN_CONFIG, else
# ./cairn.toml) with engine = "staging" and [staging] cluster and transport set, written to $CAIRN_CLUSTER.toml.
# It should end soon after cairn.halt_requested() turns true. The job fails (exit 1) when the
# cluster does not form, or when a step the drain owes is left only in memory.
set -euo pipefail
say() { echo "cairn_job: $*"; }
die() { echo "cairn_job: $*" >&2; exit 1; }
count() {  # the whole number in variable $1, else $2
  local v=${!1:-$2}
  [[ $v =~ ^[0-9]+$ ]] || die "$1=$v: give a whole number"
  echo "$v"
}
S=$(count CAIRN_SERVERS 2)
SPARES=$(count CAIRN_SPARES 0)
START_TIMEOUT=$(count CAIRN_START_TIMEOUT 120)
((S > 0)) || die "CAIRN_SERVERS=0: a cluster needs a server"
((START_TIMEOUT > 0)) || die "CAIRN_START_TIMEOUT=0: give the seconds the cluster may take to form"
N=$((S + SPARES))
FILE=$(realpath -m "${CAIRN_CLUSTER:-$PWD/cluster.json}")
PY=${PYTHON:-python3}
export CAIRN_HALT_FILE=${CAIRN_HALT_FILE:-$FILE.halt}
export CAIRN_HALT_SECONDS=${CAIRN_HALT_SECONDS:-300}
LAUNCH_SERVER=${LAUNCH_SERVER:-"srun --nodes=1 --ntasks=1 --exclusive --relative={i}"}
if [ -n "${CAIRN_IFACE:-}" ]; then
  SERVER_HOST=${SERVER_HOST:-"ip -o -4 addr show dev $CAIRN_IFACE | tr -s ' ' | cut -d' ' -f4 | cut -d/ -f1"}
fi
# `hostname -i` resolves the node's name, which /etc/hosts often maps to 127.0.1.1.
SERVER_HOST=${SERVER_HOST:-"a=\$(hostname -i | cut -d' ' -f1); case \$a in 127.*|::1) hostname -I ;; *) echo \$a ;; esac"}
SERVER_NODE=${SERVER_NODE:-"hostname"}
LAUNCH_APP=${LAUNCH_APP-"srun --relative=$N --nodes=$(( ${SLURM_NNODES:-$((N + 1))} - N ))"}
read -r -a NODES <<< "${SERVER_NODES:-}"

q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }  # $1 quoted for sh
fill() {  # the template $1 for server $2
  local t=${1//\{i\}/$2}
  echo "${t//\{node\}/${NODES[$2]:-}}"
}
serve_script() {  # the sh program that runs server $1 on its node
  local i=$1 flags
  flags="--cluster $(q "$FILE") --config $(q "$FILE.toml") --id $i --servers $S --spares $SPARES"
  flags+=" --memory $(q "${CAIRN_MEMORY:-4GiB}") --timeout $START_TIMEOUT"
  if [ -n "${CAIRN_REDUNDANCY:-}" ]; then flags+=" --redundancy $(q "$CAIRN_REDUNDANCY")"; fi
  if [ -n "${CAIRN_DRAIN:-}" ]; then flags+=" --drain $(q "$(realpath -m "$CAIRN_DRAIN")")"; fi
  if [ -n "${CAIRN_DRAIN_EVERY:-}" ]; then flags+=" --drain-every $(q "$CAIRN_DRAIN_EVERY")"; fi
  if [ -n "${CAIRN_PREFAULT:-}" ]; then flags+=" --prefault $(q "$CAIRN_PREFAULT")"; fi
  cat <<EOF
addr=\$( { $(fill "$SERVER_HOST" "$i"); } | cut -d' ' -f1)
[ -n "\$addr" ] || { echo "cairn_job: server $i on \$(hostname) has no address (SERVER_HOST printed none): set CAIRN_IFACE (e.g. ib0) or SERVER_HOST" >&2; exit 1; }
exec $(q "$PY") -m cairn serve $flags --host "\$addr" --node "\$($(fill "$SERVER_NODE" "$i"))" $(fill "${CAIRN_SERVER_ARGS:-}" "$i")
EOF
}

mkdir -p "$FILE.d"
rm -f "$CAIRN_HALT_FILE"
trap 'touch "$CAIRN_HALT_FILE"; say "halt requested (SIGUSR1): created $CAIRN_HALT_FILE, waiting for the application to end"' USR1
trap 'exit 143' TERM
trap 'exit 130' INT

# A cluster file left by a stopped cluster, or by a job that crashed (no server answers), is
# taken over; one whose servers answer is another cluster's.
if [ -e "$FILE" ]; then
  probe=$("$PY" -m cairn cluster status --cluster "$FILE" --json --timeout "$START_TIMEOUT" 2>"$FILE.d/probe.err") ||
    die "cannot read the cluster file $FILE ($(tail -n 1 "$FILE.d/probe.err")): remove it, or choose another CAIRN_CLUSTER"
  was=$("$PY" -c 'import json, sys; d = json.loads(sys.argv[1]); up = [s["id"] for s in d.get("servers", []) if s["state"] != "down"]
print("stopped" if d.get("state") == "stopped" else " ".join(map(str, up)) or "silent")' "$probe")
  case $was in
    stopped) say "taking over $FILE: its cluster was stopped" ;;
    silent) say "taking over $FILE: none of its servers answers (each asked for up to $START_TIMEOUT s; a crashed job's?)" ;;
    *) die "$FILE is in use: its servers $was answer (another job's cluster?); stop it (cairn cluster stop --cluster $FILE) or choose another CAIRN_CLUSTER" ;;
  esac
  rm -f "$FILE"
fi
# What a last run left in the folder (entries, secret, sockets) goes; its logs stay.
find "$FILE.d" -mindepth 1 -maxdepth 1 ! -name '*.log*' -exec rm -rf {} +
"$PY" -m cairn cluster client-config --cluster "$FILE" --transport "${CAIRN_TRANSPORT:-tcp}" --output "$FILE.toml" ||
  die "cannot write the application's settings $FILE.toml from ${CAIRN_CONFIG:-./cairn.toml} (see above)"
export CAIRN_CONFIG=$FILE.toml

pids=() ready=0 app=
# shellcheck disable=SC2317 # reap and finish run from the EXIT trap
reap() {  # the server launchers: asked to end, killed after 10 s
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq 50); do
    local p left=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    ((left)) || return 0
    sleep 0.2
  done
  kill -KILL "${pids[@]}" 2>/dev/null
}
# shellcheck disable=SC2317
finish() {  # on every exit: the application ended, drain, stop, report
  local rc=$?
  set +e
  trap - EXIT USR1 TERM INT
  if [ -n "$app" ]; then kill -TERM "$app" 2>/dev/null; fi
  if ((ready)); then
    local limit=${CAIRN_DRAIN_TIMEOUT:-}
    if [ -z "$limit" ] && [ -n "${SLURM_JOB_END_TIME:-}" ]; then
      limit=$((SLURM_JOB_END_TIME - $(date +%s) - 30))
      ((limit > 0)) || limit=1
    fi
    if ! "$PY" -m cairn cluster drain --cluster "$FILE" ${limit:+--timeout "$limit"}; then
      echo "cairn_job: the drain is incomplete (above); steps not on disk are lost with the cluster" >&2
      ((rc)) || rc=1
    fi
    "$PY" -m cairn cluster stop --cluster "$FILE" --no-drain || echo "cairn_job: the cluster did not stop by request; its servers are killed" >&2
    reap
  else
    reap
    # The cluster never formed: nothing runs at the file.
    rm -f "$FILE"
    find "$FILE.d" -mindepth 1 -maxdepth 1 ! -name '*.log*' -exec rm -rf {} +
  fi
  exit "$rc"
}
trap finish EXIT
no_cluster() {
  echo "cairn_job: the cluster did not form: $1; the servers' logs end with:" >&2
  for ((j = 0; j < N; j++)); do
    echo "--- $FILE.d/server-$j.log" >&2
    tail -n 15 "$FILE.d/server-$j.log" >&2 || true
  done
  exit 1
}

# Each server logs into $FILE.d/server-<id>.log (what `cairn cluster start` uses); its stdout and
# stderr go there too. The last job's logs stay as server-<id>.log.1.
for ((i = 0; i < N; i++)); do
  log="$FILE.d/server-$i.log"
  if [ -s "$log" ]; then mv -f "$log" "$log.1"; fi
  # shellcheck disable=SC2086 # the launcher is a command prefix, split on purpose
  $(fill "$LAUNCH_SERVER" "$i") sh -c "$(serve_script "$i")" >> "$log" 2>&1 &
  pids+=($!)
done

# Every server up and the control plane formed: a leader, and no voter still joining.
formed='import json, sys; d = json.load(sys.stdin); s = d["servers"]
sys.exit(not (d["leader"] is not None and all(x["state"] in ("up", "spare") for x in s)
              and not any(x["role"] in ("learner", "candidate") for x in s)))'
deadline=$((SECONDS + START_TIMEOUT))
until "$PY" -m cairn cluster status --cluster "$FILE" --json --timeout 1 2>/dev/null | "$PY" -c "$formed"; do
  for i in "${!pids[@]}"; do kill -0 "${pids[$i]}" 2>/dev/null || no_cluster "server $i exited"; done
  ((SECONDS < deadline)) || no_cluster "no leader within $START_TIMEOUT s (CAIRN_START_TIMEOUT)"
  sleep 0.5
done
ready=1
say "$S servers up (+$SPARES spares; cluster file $FILE, logs $FILE.d/server-*.log, settings $CAIRN_CONFIG)"

# In the background, so that USR1 is handled while it runs (with its stdin: a background
# command's would be /dev/null).
# shellcheck disable=SC2086
$LAUNCH_APP "$@" <&0 &
app=$!
while :; do
  status=0
  wait "$app" || status=$?
  kill -0 "$app" 2>/dev/null || break  # else a signal ended the wait, not the application
done
app=
if ((status)); then echo "cairn_job: the application exited with status $status" >&2; fi
exit "$status"
