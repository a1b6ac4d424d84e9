"""A plain-JAX GPipe peer for ``bench_pipeline``: one jitted program, ``shard_map`` over a ``"stage"`` mesh axis.

This is how JAX users commonly write a pipeline (MaxText's pipeline module is
one such design): the transformer blocks' parameters are **stacked** along a
leading layer axis and sharded over ``"stage"``, so that each of the ``S``
devices holds ``L / S`` consecutive layers and runs them with ``lax.scan``.
Microbatches move through the devices in ``M + S - 1`` ticks; at each tick
every device applies its layers to the activation it holds and passes the
result to the next device with ``lax.ppermute`` (a circular shift by one:
device 0 drops what the last device sends and takes the next microbatch
instead, and the last device's result is a finished microbatch once the
pipeline is full). Bubble ticks compute on placeholder activations whose
results are never used, so they contribute nothing to the loss or gradients.

The token embedding and the head + loss are not stacked blocks: the embedding
is computed for all microbatches before the pipelined loop, and the head and
the cross-entropy after it, with plain ``jit`` sharding on the stage mesh (the
head's microbatches are split over ``"stage"`` when ``S`` divides ``M``). The
backward is ``jax.value_and_grad`` of the whole program (JAX differentiates
through ``shard_map``, ``ppermute`` and ``scan``), so this is GPipe: all
forwards, then all backwards, every microbatch's activations kept.

The loss is the mean of the microbatches' cross-entropies, as in
``bench_pipeline.unpipelined``. Parameters come in ``gpt_params``' per-stage
list format and are converted once (``to_peer``: blocks stacked, placed on the
mesh); ``step`` returns the gradients in the peer's layout, and ``to_stages``
turns them back into the per-stage list for comparisons.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from benchmarks.models import layer_norm
from jaxaot._src.cli import demo_models

AXIS = "stage"


class PipelinePeer(NamedTuple):
    """The jitted step and the conversions between ``gpt_params``' list format and the peer's layout."""

    #: ``step(peer_params, inputs, targets) -> (loss, peer_grads)``, one jitted program.
    step: Callable[[dict, jax.Array, jax.Array], tuple[jax.Array, dict]]
    #: per-stage parameter list -> peer parameters (blocks stacked and sharded over ``"stage"``).
    to_peer: Callable[[list[dict]], dict]
    #: peer parameters or gradients -> the per-stage list, cut into the ``num_stages`` the peer was built for.
    to_stages: Callable[[dict], list[dict]]


def stage_mesh(num_stages: int, devices: list | None = None) -> Mesh:
    """A one-axis ``("stage",)`` mesh over the first ``num_stages`` devices."""
    devices = jax.devices()[:num_stages] if devices is None else list(devices)[:num_stages]
    if len(devices) < num_stages or len(set(devices)) < num_stages:
        raise ValueError(f"a {num_stages}-stage mesh needs {num_stages} distinct devices, got {len(set(devices))}")
    return Mesh(np.array(devices), (AXIS,))


def _stack(blocks: list[dict]) -> dict:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)


def _unstack(stacked: dict, count: int) -> list[dict]:
    return [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(count)]


def _shard_map(f: Callable, mesh: Mesh, in_specs: Any, out_specs: Any) -> Callable:
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # older jax: the experimental spelling
        from jax.experimental.shard_map import shard_map
    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def shard_map_gpipe(size: Any, num_stages: int, num_microbatches: int, mesh: Mesh) -> PipelinePeer:
    """The GPipe peer of ``bench_pipeline`` for a ``bench_pipeline.Size`` on ``mesh`` (one axis ``"stage"``).

    ``num_stages`` must equal the mesh's ``"stage"`` size and divide ``size.layers``;
    the batch holds ``num_microbatches`` microbatches of ``size.microbatch`` sequences.
    """
    S, M = num_stages, num_microbatches
    if size.layers % S:
        raise ValueError(f"{size.layers} layers do not split into {S} stages")
    if mesh.shape[AXIS] != S:
        raise ValueError(f"the mesh's {AXIS!r} axis has {mesh.shape[AXIS]} devices, not {S}")
    per_stage = size.layers // S
    replicated = NamedSharding(mesh, P())
    by_stage = NamedSharding(mesh, P(AXIS))
    layer = functools.partial(demo_models.block_apply, heads=size.heads)

    def stage_layers(blocks: dict, x: jax.Array) -> jax.Array:
        """This device's ``L / S`` layers on one microbatch."""
        return jax.lax.scan(lambda h, p: (layer(p, h), None), x, blocks)[0]

    def pipelined(blocks: dict, feed: jax.Array, state: jax.Array) -> jax.Array:
        """Per device: ``blocks`` its layers, ``feed`` every tick's input of device 0, ``state`` a placeholder.

        Returns the activation each tick produced here, with a leading axis of one for the stage.
        """
        first = jax.lax.axis_index(AXIS) == 0
        shift = [(i, (i + 1) % S) for i in range(S)]

        def tick(held, fed):
            out = stage_layers(blocks, jnp.where(first, fed, held))
            return jax.lax.ppermute(out, AXIS, shift), out

        _, outs = jax.lax.scan(tick, state[0], feed)
        return outs[None]

    run_stages = _shard_map(pipelined, mesh, in_specs=(P(AXIS), P(), P(AXIS)), out_specs=P(AXIS))

    def split_microbatches(a: jax.Array) -> jax.Array:
        a = a.reshape(M, -1, *a.shape[1:])
        return jax.lax.with_sharding_constraint(a, by_stage) if M % S == 0 else a

    def loss_fn(params: dict, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        xs = split_microbatches(inputs)
        ts = split_microbatches(targets)
        x = params["tok"][xs] + params["pos"]  # (M, microbatch, seq, width)
        x = jax.lax.with_sharding_constraint(x, replicated)
        feed = jnp.concatenate([x, jnp.zeros((S - 1, *x.shape[1:]), x.dtype)])  # device 0's input per tick
        state = jnp.zeros((S, *x.shape[1:]), x.dtype)
        outs = run_stages(params["blocks"], feed, state)  # (S, ticks, microbatch, seq, width)
        y = outs[S - 1, S - 1:]  # the last device's finished microbatches, in order
        if M % S == 0:
            y = jax.lax.with_sharding_constraint(y, by_stage)
        logits = layer_norm(y, params["ln"]["scale"], params["ln"]["bias"]) @ params["head"]
        return jnp.mean(jax.vmap(_cross_entropy)(logits, ts))

    step = jax.jit(jax.value_and_grad(loss_fn))

    def to_peer(stage_params: list[dict]) -> dict:
        blocks = [b for p in stage_params for b in p["blocks"]]
        if len(blocks) != size.layers:
            raise ValueError(f"expected {size.layers} blocks, got {len(blocks)}")
        peer = {"tok": stage_params[0]["tok"], "pos": stage_params[0]["pos"], "ln": stage_params[-1]["ln"],
                "head": stage_params[-1]["head"], "blocks": blocks}
        shardings = {k: jax.tree.map(lambda _: by_stage if k == "blocks" else replicated, v)
                     for k, v in peer.items()}
        shardings["blocks"] = shardings["blocks"][0]
        gather = jax.jit(lambda p: {**p, "blocks": _stack(p["blocks"])}, out_shardings=shardings)
        return gather(peer)

    def to_stages(peer: dict) -> list[dict]:
        blocks = _unstack(peer["blocks"], size.layers)
        out = [{"blocks": blocks[s * per_stage:(s + 1) * per_stage]} for s in range(S)]
        out[0].update(tok=peer["tok"], pos=peer["pos"])
        out[-1].update(ln=peer["ln"], head=peer["head"])
        return out

    return PipelinePeer(step, to_peer, to_stages)


def _cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``bench_pipeline.cross_entropy`` (the mean over one microbatch's tokens), kept here to avoid an import cycle."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def timed_peer(size: Any, num_stages: int, num_microbatches: int, devices: list, params: list[dict],
               inputs: jax.Array, targets: jax.Array) -> tuple[Callable[[], Any], jax.Array, list[dict]]:
    """The peer on ``devices``, ready to time: ``(run, loss, grads)``.

    ``run()`` is one step on parameters already placed on the mesh; ``loss``
    and ``grads`` (per-stage list format, on the host, so that they compare
    with arrays on any device) are one step's results, for a check against
    ``unpipelined``.
    """
    peer = shard_map_gpipe(size, num_stages, num_microbatches, stage_mesh(num_stages, devices))
    peer_params = peer.to_peer(params)
    loss, grads = peer.step(peer_params, inputs, targets)
    return functools.partial(peer.step, peer_params, inputs, targets), loss, jax.device_get(peer.to_stages(grads))
