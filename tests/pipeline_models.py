"""Pipeline test models: a tanh MLP and a small GPT cut into stages, and the unpipelined reference.

The GPT's first stage embeds tokens and its last projects to logits, so first and last stages differ
from the middle ones, as in real pipelines. ``unpipelined`` is the reference every pipeline test compares
with: ``jax.value_and_grad`` of the mean microbatch loss of the composed stages.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxaot._src.cli import demo_models
from zoo import layer_norm, random_tree, sds


def mlp_stage(params, x):
    return jnp.tanh(x @ params["w"] + params["b"])


def mse(y, t):
    return jnp.mean((y - t) ** 2)


def mlp_model(num_stages: int, key: jax.Array, batch: int = 16, width: int = 8):
    params, x, t = random_tree(key, ([{"w": sds(width, width), "b": sds(width)} for _ in range(num_stages)],
                                     sds(batch, width), sds(batch, width)), scale=0.5)
    return [mlp_stage] * num_stages, mse, params, x, t


def widening_stage(params, x):
    return jnp.tanh(jnp.tanh(x @ params["w_in"]) @ params["w_out"])


def widening_model(num_stages: int, key: jax.Array, batch: int = 512, io: int = 16):
    """An MLP whose stage ``i`` has hidden width ``64 (i + 1)`` between ``io``-wide messages: stages whose
    parameters and residuals all differ in shape, the last the largest."""
    shapes = [{"w_in": sds(io, 64 * (i + 1)), "w_out": sds(64 * (i + 1), io)} for i in range(num_stages)]
    params, x, t = random_tree(key, (shapes, sds(batch, io), sds(batch, io)), scale=0.3)
    return [widening_stage] * num_stages, mse, params, x, t


VOCAB, WIDTH, HEADS, SEQ = 16, 16, 2, 8


def gpt_stage(params, x):
    """Embeds tokens on the first stage (``tok`` in params), runs its blocks, projects to logits on the last."""
    if "tok" in params:
        x = params["tok"][x] + params["pos"]
    for block in params["blocks"]:
        x = demo_models.block_apply(block, x, heads=HEADS)
    if "head" in params:
        x = layer_norm(x, params["ln"]["scale"], params["ln"]["bias"]) @ params["head"]
    return x


def cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def gpt_model(num_stages: int, key: jax.Array, batch: int = 8):
    block = jax.eval_shape(functools.partial(demo_models.block_init, width=WIDTH, heads=HEADS, dtype=jnp.float32),
                           jax.random.key(0))
    shapes = [{"blocks": [block]} for _ in range(num_stages)]
    shapes[0].update(tok=sds(VOCAB, WIDTH), pos=sds(SEQ, WIDTH))
    shapes[-1].update(ln={"scale": sds(WIDTH), "bias": sds(WIDTH)}, head=sds(WIDTH, VOCAB))
    k1, k2, k3 = jax.random.split(key, 3)
    params = random_tree(k1, shapes)
    tokens = jax.random.randint(k2, (batch, SEQ), 0, VOCAB)
    targets = jax.random.randint(k3, (batch, SEQ), 0, VOCAB)
    return [gpt_stage] * num_stages, cross_entropy, params, tokens, targets


MODELS = {"mlp": mlp_model, "gpt": gpt_model}


def unpipelined(stages, loss_fn, num_microbatches):
    """The reference: the mean of the microbatches' losses of the composed stages (vmapped, not unrolled);
    integer and key parameters get float0 gradients."""

    def one(params, x, t):
        for fn, p in zip(stages, params):
            x = fn(p, x)
        return loss_fn(x, t)

    def loss(params, x, t):
        xs = x.reshape(num_microbatches, -1, *x.shape[1:])
        ts = t.reshape(num_microbatches, -1, *t.shape[1:])
        return jnp.mean(jax.vmap(one, in_axes=(None, 0, 0))(params, xs, ts))

    return jax.jit(jax.value_and_grad(loss, allow_int=True))
