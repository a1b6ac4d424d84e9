export PYTHONPATH=.
for spec in "postln_relu_block jaxaot:736125012" "postln_relu_block jaxaot:1.0" "postln_relu_block jax:none" "llama_scanned jaxaot:1523452004" "postln_relu_block jaxaot:723542100"; do
  echo "=== $spec"
  timeout 150 python -m benchmarks.probes.first_step $spec --peaks 2>&1 | grep -v cuda_timer | head -80
done
