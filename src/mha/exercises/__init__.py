"""Graded "write it yourself" exercises: checkers that run *your* attention code against the book's derivation.

Each checker takes the function you wrote, calls it on a series of cases (small shapes first, then the hard ones:
large logits, fully masked rows, L_q != L_kv, one head, one key/value head, non-contiguous inputs, a batch of one,
head_dim != d_model / n_heads, lengths that are not a multiple of the block size) and compares every result with the
NumPy float64 reference, ``mha.reference``. It returns None when your function is right. Otherwise it raises
:class:`ExerciseError` (an ``AssertionError``) whose message names the case (shapes, flags), shows a few expected and
actual numbers, and names the book's equation your result breaks. When your result equals what a *known bug* would
produce on that case (the checker computes each known bug's output independently and compares), the message names
the bug and gives a hint.

Checkers (``fn`` is your function, called as shown):

* ``check_softmax(fn)``: ``fn(x, axis=-1)``, the softmax of x along axis.
* ``check_scaled_dot_product_attention(fn)``: ``fn(q, k, v, mask=None, scale=None) -> (out, weights)``.
* ``check_split_heads(fn)``: ``fn(y, n_heads)``, (N, L, h*head_dim) -> (N, h, L, head_dim).
* ``check_merge_heads(fn)``: ``fn(y)``, (N, h, L, head_dim) -> (N, L, h*head_dim).
* ``check_multi_head_attention(fn, gqa=False)``: ``fn(x_q, x_kv, params, n_heads, mask=None) -> (out, weights)``.
* ``check_causal_mask(fn)``: ``fn(l_q, l_kv)``, a boolean (l_q, l_kv) causal mask aligned bottom-right.
* ``check_repeat_kv(fn)``: ``fn(y, n_rep)``, (N, g, L, d) -> (N, g*n_rep, L, d).
* ``check_decode_step(fn)``: ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_cache, v_cache)``, one cached
  decoding step.
* ``check_online_softmax_attention(fn)``: ``fn(q, k, v, block_size, mask=None, scale=None) -> out``.
* ``check_softmax_backward(fn)``: ``fn(weights, grad_weights) -> grad_scores``.
* ``check_scaled_dot_product_attention_grad(fn)``: ``fn(q, k, v, grad_out, mask=None, scale=None) -> (dq, dk, dv)``.

Part IV, attention in today's models:

* ``check_rope(fn, style="half")``: ``fn(x, positions, base=10000.0)``, RoPE on the last axis of x (..., L, d);
  ``style`` says which pairing your function implements, "half" (x[i], x[i + d/2]) or "interleaved" (x[2i], x[2i+1]).
* ``check_rope_decode_step(fn, style="half")``: ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_cache, v_cache)``,
  a cached decoding step whose cache stores rotated keys and whose new positions are c .. c+T-1.
* ``check_sliding_window_mask(fn)``: ``fn(l_q, l_kv, window)``, a boolean (l_q, l_kv) mask: query i at position
  p = l_kv - l_q + i sees the keys p - window < j <= p.
* ``check_sink_attention(fn)``: ``fn(q, k, v, sinks, mask=None, scale=None) -> (out, weights)``, one sink logit per
  head joining each row's softmax and dropped afterwards.
* ``check_rms_norm(fn)``: ``fn(x, weight, eps=1e-6)``, RMSNorm over the last axis (QK-norm).
* ``check_latent_decode_step(fn, style="half")``: ``fn(q_nope, q_rope, c_new, k_rope_new, c_cache, k_rope_cache, W_uk,
  W_uv) -> (out, c_cache, k_rope_cache)``, one absorbed decoding step of multi-head latent attention: the cache holds
  one latent and one rotated rotary key per position, every head scores them with its absorbed query.
* ``check_gated_attention(fn)``: ``fn(x_q, x_kv, params, n_heads, gate, mask=None) -> (out, weights)``, gated
  multi-head attention: each head's output times ``sigmoid(x_q W_gate + b_gate)`` (``gate="headwise"``: one value
  per head and query; ``"elementwise"``: one per coordinate) before the heads are merged and projected by W_o.

Conventions (those of ``mha.reference``): row vectors, ``Y = X W``; masks are boolean, True = may attend; a query row
with no allowed key gets zero weights and a zero output (never NaN); query head j reads key/value head
``j // (n_heads / n_kv_heads)``; ``params`` holds ``W_q (d_model, h*head_dim)``, ``W_k``/``W_v (d_model,
g*head_dim)``, ``W_o (h*head_dim, d_model)`` and optional biases ``b_q``, ``b_k``, ``b_v``, ``b_o``.

Inputs are NumPy float64 arrays. With ``backend="torch"`` they are torch float64 tensors instead (non-contiguous
where the case says so); ``backend="auto"`` (the default) uses NumPy unless your function fails on the first case with
NumPy arrays and works with tensors. Your function may return NumPy arrays or torch tensors either way. Results are
compared in float64 with a relative tolerance of 1e-5: compute in the dtype you are given. Every checker also
verifies that your function does not modify its inputs in place. torch is imported only when tensors are involved.

Time limit: every checker takes ``timeout=`` (seconds, default :data:`TIMEOUT` = 10; ``timeout=None``: no limit). Each
call of your function on a case may take that long; a call that runs longer is stopped and reported as
:class:`ExerciseTimeout` (an ``ExerciseError``) naming the case that was running, so that an infinite loop fails the
check instead of hanging your script, your Jupyter cell or the book build. The limit is per call, not per checker: a
slow but correct function is not failed for the number of cases, and the case named is the one that hung. Ten seconds
is about a thousand times what a plain Python loop over the elements needs on these small cases, and leaves room for a
first ``import torch`` inside your function. In the main thread (scripts, Jupyter) the limit is a SIGALRM timer, which
also interrupts ``time.sleep`` (an alarm you set yourself is kept, and fires first if it is due first); in any other
thread a watchdog thread raises in yours, which stops Python code but not one long C call (such as ``time.sleep``)
until that call returns.

Language: ``set_language("zh")`` (or ``MHA_EXERCISES_LANGUAGE=zh``) gives every message in Chinese, the book's Chinese
edition's; numbers, shapes and code stay as they are (``mha.exercises.language``).

Book: the checked functions are derived in parts I, II and IV; each checker's docstring names its chapter, and the
appendix 'Check your own implementation' lists them all.

The package, one job a module: ``catalogue`` (the book's equations and the known bugs), ``runner`` (running the cases:
calls, comparisons, diagnosis, messages), ``timelimit`` (stopping a call that runs too long), ``simulators`` (what each
known bug computes), and the checkers by topic: ``attention_checks`` (softmax, attention, online softmax),
``head_checks`` (split, merge, multi-head attention, repeat_kv), ``decoding_checks`` (causal mask, a decode step),
``gradient_checks`` (the backward passes), ``frontier_checks`` (part IV: RoPE, a decode step with RoPE, the
sliding-window mask, sinks, RMSNorm, whose bugs ``frontier_simulators`` computes), ``latent_checks`` (part IV:
multi-head latent attention's absorbed decoding step, with its bugs' simulators). Everything a reader uses is imported
here. ``gate_checks`` (part IV: gated attention, with its bugs' simulator) is one more checker module.
"""

from mha.exercises.attention_checks import (check_online_softmax_attention, check_scaled_dot_product_attention,
                                            check_softmax)
from mha.exercises.catalogue import KNOWN_BUGS, Equation, KnownBug  # noqa: F401 (the types of the catalogue)
from mha.exercises.decoding_checks import check_causal_mask, check_decode_step
from mha.exercises.frontier_checks import (check_rms_norm, check_rope, check_rope_decode_step, check_sink_attention,
                                           check_sliding_window_mask)
from mha.exercises.gradient_checks import check_scaled_dot_product_attention_grad, check_softmax_backward
from mha.exercises.head_checks import check_merge_heads, check_multi_head_attention, check_repeat_kv, check_split_heads
from mha.exercises.latent_checks import check_latent_decode_step
from mha.exercises.gate_checks import check_gated_attention
from mha.exercises.language import get_language, set_language
from mha.exercises.runner import ATOL, RTOL, TIMEOUT, ExerciseError, ExerciseTimeout  # noqa: F401 (tolerances)

__all__ = [
    "set_language",
    "get_language",
    "ExerciseError",
    "ExerciseTimeout",
    "TIMEOUT",
    "KNOWN_BUGS",
    "check_softmax",
    "check_scaled_dot_product_attention",
    "check_split_heads",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_causal_mask",
    "check_repeat_kv",
    "check_decode_step",
    "check_online_softmax_attention",
    "check_softmax_backward",
    "check_scaled_dot_product_attention_grad",
    "check_rope",
    "check_rope_decode_step",
    "check_sliding_window_mask",
    "check_sink_attention",
    "check_rms_norm",
    "check_latent_decode_step",
    "check_gated_attention",
]
