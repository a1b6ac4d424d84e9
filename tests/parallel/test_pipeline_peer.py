"""The plain-JAX GPipe peer of bench_pipeline (shard_map over a "stage" axis) equals the unpipelined model.

``benchmarks.pipeline_peer.shard_map_gpipe`` stacks the GPT's blocks, shards
them over a ``("stage",)`` mesh and moves microbatches through the devices with
``lax.ppermute``; its loss and gradients must be ``bench_pipeline.unpipelined``'s
(the mean of the microbatches' losses) on fresh random parameters and batches.
The stage count is 4 where there are 4 devices (the conftest gives 8 CPU
devices), else 2.
"""

from __future__ import annotations

import functools

import jax
import pytest

from benchmarks.bench_pipeline import SIZES, batch, gpt_params, gpt_stage, unpipelined
from benchmarks.pipeline_peer import shard_map_gpipe, stage_mesh
from zoo import assert_trees_close, key_stream, random_tree

fresh_key = key_stream(9700)


def _stages() -> int:
    return 4 if jax.device_count() >= 4 else 2


@pytest.mark.skipif(jax.device_count() < 2, reason="a pipeline over a stage mesh needs at least 2 devices")
def test_peer_matches_unpipelined():
    size, S, M = SIZES["small"], _stages(), 4
    stages = [functools.partial(gpt_stage, heads=size.heads)] * S
    # fresh values in gpt_params' layout (drawn at once: building them block by block is seconds of small compiles)
    params = random_tree(fresh_key(), jax.eval_shape(lambda k: gpt_params(k, size, S), jax.random.key(0)), 0.1)
    inputs, targets = batch(fresh_key(), size, M)
    peer = shard_map_gpipe(size, S, M, stage_mesh(S))
    peer_params = peer.to_peer(params)
    assert peer_params["blocks"]["qkv"].shape[0] == size.layers
    assert peer_params["blocks"]["qkv"].addressable_shards[0].data.shape[0] == size.layers // S

    loss, grads = peer.step(peer_params, inputs, targets)
    want_loss, want_grads = unpipelined(stages, M)(params, inputs, targets)
    assert_trees_close(loss, want_loss, rtol=1e-5, atol=0)
    assert_trees_close(peer.to_stages(grads), want_grads, rtol=1e-5, atol=1e-7)
    assert_trees_close(peer.to_stages(peer_params), params, rtol=0, atol=0)


@pytest.mark.skipif(jax.device_count() < 2, reason="a pipeline over a stage mesh needs at least 2 devices")
def test_peer_refuses_a_mismatched_mesh():
    size = SIZES["small"]
    with pytest.raises(ValueError, match="not 4"):
        shard_map_gpipe(size, 4, 4, stage_mesh(2))
    with pytest.raises(ValueError, match="do not split"):
        shard_map_gpipe(size, 3, 4, stage_mesh(2))
    with pytest.raises(ValueError, match="distinct devices"):
        stage_mesh(2, [jax.devices()[0]] * 2)
