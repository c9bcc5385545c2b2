#!/bin/sh
# tools/train across the hosts of tools/cluster/cluster.sh (Note [Namespace cluster]): four
# network-namespace hosts that talk over veth links by TCP only.
#   - ZeRO stages 1, 2 and 3 across 3 hosts give the single-process losses and weights
#     within 1e-6, as on one host (tests/tools/trainer/train_mpi_test.sh);
#   - (pipe, data, model) = (2, 1, 2) across 4 hosts gives the single-process run within
#     1e-5, and 1-bit Adam across 4 hosts the bits of 4 ranks on one host;
#   - the bytes the hosts' interfaces sent during the stage-2 run, against the bytes the
#     communicators counted (Note [Bytes sent] in parallel/comm/communicator.h): at least
#     those, at most 1.6 times (TCP/IP headers, MPI's protocol, Open MPI's own algorithms
#     and its out-of-band channel; the measured ratio is printed);
#   - a host whose link is cut mid-run ends the job: the ranks left stop within the
#     collective timeout, an error names the operation and the rank that did not answer,
#     the exit code is non-zero, and the last committed checkpoint loads;
#   - nothing of the cluster is left afterwards (cluster.sh down checks).
# Needs root, ip and tc: skipped, saying so, without them.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
NAME=cluster HOSTS=4
. "$RUNFILES/tests/tools/cluster/cluster_env.sh"
ZERO_TO_FP32="$RUNFILES/tools/zero_to_fp32"
. "$RUNFILES/tests/mpi_env.sh"

# The model of train_mpi_test.sh (mpi_configs.sh), 12 sequences a step.
batch12='"train_batch_size": 12, "gradient_accumulation_steps": 2'

# sent_bytes, sent_packets: what all hosts' interfaces have sent.
sent_bytes() {
  "$CLUSTER" bytes "$PREFIX" | awk '{s += $2} END {print s}'
}
sent_packets() {
  "$CLUSTER" bytes "$PREFIX" | awk '{s += $4} END {print s}'
}

config single 0 6 "$batch12"
"$TRAIN" --config single.json >single.log 2>&1 || fail "the single-process run failed: $(tail -n 5 single.log)"
for stage in 1 2 3; do
  name="s${stage}_hosts3"
  config "$name" "$stage" 6 "$batch12"
  before=$(sent_bytes) before_packets=$(sent_packets)
  on_cluster 3 "$name" --comm-timeout 60 || fail "$name failed: $(tail -n 5 "$name.log")"
  [ "$stage" != 2 ] || wire=$(($(sent_bytes) - before)) packets=$(($(sent_packets) - before_packets))
  "$COMPARE" single "$name" 1e-6 || fail "$name differs from the single-process run"
done
echo "ok: ZeRO stages 1-3 across 3 hosts equal one process"

# The communicators' count: rank 0's bytes per op (every rank of these symmetric
# collectives sends as much), times 3.
counted=$(sed -n 's/.*\] *\(all_reduce\|reduce_scatter\|all_gather\|broadcast\): [0-9]* calls, \([0-9.]*\) MB sent.*/\2/p' \
  s2_hosts3.log | awk '{s += $1} END {printf "%.0f", s * 1e6 * 3}')
[ "$counted" -gt 0 ] || fail "no communication summary in s2_hosts3.log: $(grep -i 'sent' s2_hosts3.log | head -n 3)"
ratio=$(awk -v w="$wire" -v c="$counted" 'BEGIN {printf "%.3f", w / c}')
# Ethernet, IPv4 and TCP (with timestamps) headers: 14 + 20 + 32 bytes a packet.
payload=$(awk -v w="$wire" -v p="$packets" -v c="$counted" 'BEGIN {printf "%.3f", (w - 66 * p) / c}')
echo "stage 2 across 3 hosts: $wire bytes on the wire in $packets packets, $counted counted by the" \
  "communicators: ratio $ratio, $payload without the packets' headers"
awk -v r="$ratio" 'BEGIN {exit !(r >= 1.0 && r <= 1.6)}' ||
  fail "wire bytes / counted bytes = $ratio; expected 1.0 to 1.6"
echo "ok: the wire carried $ratio times the bytes the communicators counted"

# 3D: (pipe, data, model) = (2, 1, 2), one rank a host.
config3d single3d 1 1 0
"$TRAIN" --config single3d.json >single3d.log 2>&1 || fail "single3d failed: $(tail -n 5 single3d.log)"
config3d p2d1m2 2 2 1
on_cluster 4 p2d1m2 --comm-timeout 60 || fail "p2d1m2 failed: $(tail -n 5 p2d1m2.log)"
"$COMPARE" single3d p2d1m2 1e-5 || fail "the (2, 1, 2) run across 4 hosts differs from one process"
echo "ok: (2, 1, 2) across 4 hosts equals one process"

# 1-bit Adam (4 full-precision steps, then compressed): across 4 hosts as on one.
for where in hosts local; do
  config "onebit_$where" 0 8 '"train_batch_size": 16, "gradient_accumulation_steps": 2'
  sed -i 's/"type": "AdamW", "params": {/"type": "OneBitAdam", "params": {"freeze_step": 4, /' \
    "onebit_$where.json"
  if [ "$where" = hosts ]; then
    on_cluster 4 onebit_hosts --comm-timeout 60 || fail "onebit_hosts failed: $(tail -n 5 onebit_hosts.log)"
  else
    mpi_run 240 4 "$TRAIN" --config onebit_local.json --comm-timeout 60 >onebit_local.log 2>&1 ||
      fail "onebit_local failed: $(tail -n 5 onebit_local.log)"
  fi
done
grep -q '"comm":"compressed"' onebit_hosts/log/metrics.jsonl ||
  fail "onebit_hosts never compressed: $(tail -n 1 onebit_hosts/log/metrics.jsonl)"
"$COMPARE" onebit_local onebit_hosts 0 || fail "1-bit Adam across 4 hosts differs from 4 ranks on one host"
echo "ok: 1-bit Adam across 4 hosts gives the bits of 4 ranks on one host"

# A cut link: host 2's bridge port goes down at step 3 of a long run.
config cut 1 100000 "$batch12"
timeout 120 "$CLUSTER" mpirun "$PREFIX" 3 -- "$TRAIN" --config cut.json --comm-timeout 5 \
  >cut.log 2>&1 &
job=$!
BACKGROUND=$job
deadline=$(($(date +%s) + 60))
until grep -q '"step":3,' cut/log/metrics.jsonl 2>/dev/null; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "cut: the run did not reach step 3 in 60 s: $(tail -n 5 cut.log)"
  sleep 0.1
done
start=$(date +%s)
"$CLUSTER" cut "$PREFIX" 2
code=0
wait "$job" || code=$?
took=$(($(date +%s) - start))
[ "$code" -ne 0 ] && [ "$code" -ne 124 ] || fail "cut: expected the job to fail, found exit code $code after $took s"
[ "$took" -lt 60 ] || fail "cut: the job took $took s to end after the link was cut"
grep -Eq '\[train\] step [0-9]+: \[comm world, rank [01] of 3\] [a-z_]+ #[0-9]+: timed out after 5000 ms: rank\(s\) 2 did not answer a roll call' cut.log ||
  fail "cut: no error naming rank 2: $(grep -i error cut.log | head -n 3)"
"$ZERO_TO_FP32" --checkpoint cut/ckpt --out cut.safetensors >cut.fp32.log 2>&1 ||
  fail "cut: the last committed checkpoint does not load: $(cat cut.fp32.log)"
echo "ok: a cut link ends the job in $took s, naming rank 2; the last checkpoint loads"
