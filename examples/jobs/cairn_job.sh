#!/usr/bin/env bash
# A multi-node job that stages through Cairn: CAIRN_SERVERS staging servers on nodes of their own,
# the simulation on the others, the cluster stopped (and drained, with CAIRN_DRAIN) at the end.
#
#   sbatch --nodes=6 examples/jobs/cairn_job.sh ./my_simulation args...     # Slurm: 2 server nodes
#   LAUNCH_SERVER="mpirun -n 1 --host {node}" SERVER_NODES="n1 n2" LAUNCH_APP="mpirun -n 16 --hostfile app.hosts" \
#     examples/jobs/cairn_job.sh ./my_simulation args...                     # mpirun and a hostfile
#
# Settings (environment; {i} is the server's index, {node} its entry in SERVER_NODES):
#   CAIRN_SERVERS   servers (default 2)                 CAIRN_MEMORY  memory per server (default 4GiB)
#   CAIRN_CLUSTER   cluster file, on a file system every node sees (default $PWD/cluster.json)
#   CAIRN_REDUNDANCY server failures variables survive (default 1)
#   CAIRN_DRAIN     drain committed steps to this folder (default: no drain)
#   LAUNCH_SERVER   runs a command on server {i}'s node (default: srun --nodes=1 --ntasks=1 --exclusive --relative={i})
#   SERVER_HOST     prints the address server {i} listens on, run on its node (default: hostname -i)
#   SERVER_NODE     prints its node name for placement, run on its node (default: hostname)
#   LAUNCH_APP      runs the simulation (default: srun --relative=$CAIRN_SERVERS --nodes=$((SLURM_NNODES - CAIRN_SERVERS)))
#   PYTHON          the Python with Cairn installed (default: python3)
# The simulation finds the cluster through $CAIRN_CONFIG (a cairn.toml this script writes).
set -euo pipefail
S=${CAIRN_SERVERS:-2}
FILE=$(realpath -m "${CAIRN_CLUSTER:-$PWD/cluster.json}")
PY=${PYTHON:-python3}
LAUNCH_SERVER=${LAUNCH_SERVER:-"srun --nodes=1 --ntasks=1 --exclusive --relative={i}"}
SERVER_HOST=${SERVER_HOST:-"hostname -i"}
SERVER_NODE=${SERVER_NODE:-"hostname"}
LAUNCH_APP=${LAUNCH_APP-"srun --relative=$S --nodes=$(( ${SLURM_NNODES:-$((S + 1))} - S ))"}
read -r -a NODES <<< "${SERVER_NODES:-}"
[ -e "$FILE" ] && { echo "cairn_job: $FILE exists: another cluster runs there (or remove it)" >&2; exit 1; }
mkdir -p "$(dirname "$FILE")"

fill() {  # the template $1 for server $2
  local t=${1//\{i\}/$2}
  echo "${t//\{node\}/${NODES[$2]:-}}"
}

pids=()
# Each server logs into $FILE.d/server-<id>.log (what `cairn cluster start` uses); its stdout and
# stderr go there too. The last job's logs stay as server-<id>.log.1.
mkdir -p "$FILE.d"
for ((i = 0; i < S; i++)); do
  log="$FILE.d/server-$i.log"
  if [ -s "$log" ]; then mv -f "$log" "$log.1"; fi
  serve="exec $PY -m cairn serve --cluster '$FILE' --id $i --servers $S --memory '${CAIRN_MEMORY:-4GiB}' \
    --redundancy ${CAIRN_REDUNDANCY:-1} --host \"\$($(fill "$SERVER_HOST" "$i") | cut -d' ' -f1)\" \
    --node \"\$($(fill "$SERVER_NODE" "$i"))\" --timeout 120${CAIRN_DRAIN:+ --drain '$CAIRN_DRAIN'}"
  # shellcheck disable=SC2086 # the launcher is a command prefix, split on purpose
  $(fill "$LAUNCH_SERVER" "$i") sh -c "$serve" >> "$log" 2>&1 &
  pids+=($!)
done
stop() {
  "$PY" -m cairn cluster stop --cluster "$FILE" || kill "${pids[@]}" 2>/dev/null || true
}
trap stop EXIT

# Wait for every server and the control plane's leader.
for _ in $(seq 600); do
  if "$PY" -m cairn cluster status --cluster "$FILE" --json --timeout 1 2>/dev/null \
     | "$PY" -c "import json,sys; d=json.load(sys.stdin); sys.exit(not (d['leader'] is not None and all(s['state'] == 'up' for s in d['servers'])))"; then
    break
  fi
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "cairn_job: a server exited; see $FILE.d/server-*.log" >&2; exit 1; }; done
  sleep 0.2
done
printf 'engine = "staging"\n[staging]\ncluster = "%s"\ntransport = "tcp"\n' "$FILE" > "$FILE.toml"
echo "cairn_job: $S servers up (cluster file $FILE, logs $FILE.d/server-*.log)"
# shellcheck disable=SC2086
CAIRN_CONFIG="$FILE.toml" $LAUNCH_APP "$@"
