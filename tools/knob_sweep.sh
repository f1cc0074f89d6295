#!/usr/bin/env bash
# Reduction knob sweep on the GPU: one bench/normalization.py run (no torch.compile) per setting.
#   bash tools/knob_sweep.sh "batch_norm,softmax 1024" "PYFUSER_RED_CLUSTER=2" "PYFUSER_CLUSTERS=0" ...
only="$1"; shift
for setting in "default" "$@"; do
    echo "=== $setting"
    if [ "$setting" = default ]; then env_args=(); else env_args=($setting); fi
    env "${env_args[@]}" timeout 120 python3 bench/normalization.py --no-compile --only "$only" 2>&1 \
        | grep "^| [a-z]" | cut -d'|' -f2-6
done
