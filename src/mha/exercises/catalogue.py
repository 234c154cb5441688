"""The book's equations and the catalogue of known bugs: what a checker names when your result is wrong.

``Equation`` is a label of the book (``{eq}`label``) and the chapter that derives it; ``KNOWN_BUGS`` maps each bug id
(``ExerciseError.bug``) to what the buggy code computes, a hint, and the equation it breaks. ``ERROR_HINTS`` are
hints for exceptions, keyed on a fragment of the exception's message. What each bug *computes* lives in
``mha.exercises.simulators`` (part IV's checkers: ``mha.exercises.frontier_simulators``; multi-head latent attention:
``mha.exercises.latent_checks``); every bug id there is a key here.
"""

from __future__ import annotations

from typing import NamedTuple

class Equation(NamedTuple):
    label: str  # the equation's label in the book: {eq}`label`
    chapter: str  # where it is derived


SDPA_CH = "part I 'Scaled dot-product attention'"
SCALING_CH = "part I 'Why divide by √dₖ'"
MHA_CH = "part I 'From one head to h heads'"
BWD_CH = "part II 'The backward pass'"
KV_CH = "part II 'Autoregressive decoding and the KV cache'"
GQA_CH = "part II 'MQA and GQA'"
ONLINE_CH = "part II 'Exact attention without the L × L matrix'"

EQ_SOFTMAX = Equation("sdpa-softmax", SDPA_CH)
EQ_SAFE_SOFTMAX = Equation("online-safe", ONLINE_CH)
EQ_SDPA = Equation("sdpa-attention", SDPA_CH)
EQ_SCALED = Equation("sdpa-scaled", SDPA_CH)
EQ_SCALE_VARIANCE = Equation("scaling-var-scaled", SCALING_CH)
EQ_MASKED_SOFTMAX = Equation("sdpa-masked-softmax", SDPA_CH)
EQ_FUSED = Equation("multihead-fused", MHA_CH)
EQ_BLOCKS = Equation("multihead-blocks", MHA_CH)
EQ_MHA_HEAD = Equation("multihead-head", MHA_CH)
EQ_MHA_OUTPUT = Equation("multihead-output", MHA_CH)
EQ_MHA_PROJ = Equation("multihead-proj", MHA_CH)
EQ_GQA_MAP = Equation("gqa-map", GQA_CH)
EQ_GQA_HEAD = Equation("gqa-head", GQA_CH)
EQ_CHUNK_MASK = Equation("kv-chunk-mask", KV_CH)
EQ_KV_STEP = Equation("kv-step", KV_CH)
EQ_ONLINE = Equation("online-matrix", ONLINE_CH)
EQ_ONLINE_M = Equation("online-rec-m", ONLINE_CH)
EQ_ONLINE_L = Equation("online-rec-l", ONLINE_CH)
EQ_ONLINE_ACC = Equation("online-rec-acc", ONLINE_CH)
EQ_ONLINE_FINAL = Equation("online-final", ONLINE_CH)
EQ_SOFTMAX_VJP = Equation("bwd-softmax-vjp", BWD_CH)
EQ_SOFTMAX_JAC = Equation("bwd-softmax-jac", BWD_CH)
EQ_DV_DA = Equation("bwd-attn-dv-da", BWD_CH)
EQ_DS = Equation("bwd-attn-ds", BWD_CH)
EQ_DQ_DK = Equation("bwd-attn-dq-dk", BWD_CH)

FLASH_CH = "part II 'From the recurrence to a kernel'"
EQ_FK_DS = Equation("fk-ds", FLASH_CH)

# Part IV, attention in today's models: book/part4/rope.md, windows_and_sinks.md, qk_norm.md.
ROPE_CH = "part IV 'Rotary position embeddings (RoPE)'"
WINDOWS_CH = "part IV 'Sliding windows and attention sinks'"
QK_NORM_CH = "part IV 'QK-norm and logit soft-capping'"

EQ_ROPE_ROTATION = Equation("rope-rotation", ROPE_CH)
EQ_ROPE_FREQ = Equation("rope-freq", ROPE_CH)
EQ_ROPE_RELATIVE = Equation("rope-relative", ROPE_CH)
EQ_ROPE_CACHE = Equation("rope-cache", ROPE_CH)
EQ_WINDOW_MASK = Equation("window-mask", WINDOWS_CH)
EQ_SINK_SOFTMAX = Equation("sink-softmax", WINDOWS_CH)
EQ_RMSNORM = Equation("rmsnorm", QK_NORM_CH)

# Part IV, multi-head latent attention: book/part4/latent_attention.md.
LATENT_CH = "part IV 'Multi-head latent attention (MLA)'"

EQ_MLA_HEAD = Equation("mla-head", LATENT_CH)
EQ_MLA_CACHE = Equation("mla-cache", LATENT_CH)
EQ_MLA_ABSORB_SCORE = Equation("mla-absorb-score", LATENT_CH)
EQ_MLA_ABSORB_OUT = Equation("mla-absorb-out", LATENT_CH)
EQ_MLA_ROPE_BLOCKS = Equation("mla-rope-blocks", LATENT_CH)
EQ_MLA_DECODE = Equation("mla-decode-step", LATENT_CH)

# Part IV, gated attention: book/part4/gated_attention.md (its checker and bug simulator: mha.exercises.gate_checks).
GATE_CH = "part IV 'Gated attention'"

EQ_GATE_LAYER = Equation("gate-layer", GATE_CH)


class KnownBug(NamedTuple):
    description: str  # what the buggy code computes
    hint: str  # where to look
    equation: Equation | None  # the equation it breaks (None: not about an equation)


KNOWN_BUGS: dict[str, KnownBug] = {
    # --- softmax --------------------------------------------------------------------------------------------------
    "no_max_subtraction": KnownBug(
        "the softmax exponentiates the scores without subtracting the row maximum, so exp overflows to inf for "
        "large logits (inf / inf = NaN)",
        "subtract the row maximum before exp: e = exp(x - x.max(axis, keepdims=True)). By the shift lemma "
        "(sdpa-lem-shift) this changes nothing mathematically, and every exponent becomes <= 0.",
        EQ_SAFE_SOFTMAX),
    "shift_not_row_max": KnownBug(
        "the softmax subtracts a maximum that is not the row's own (the maximum of the whole array, or along another "
        "axis), so a row far below that maximum underflows to 0 / 0 = NaN",
        "take the maximum along the softmax axis, with keepdims: x.max(axis=axis, keepdims=True).",
        EQ_SAFE_SOFTMAX),
    "softmax_wrong_axis": KnownBug(
        "the softmax normalises along the wrong axis (or over all entries at once): the entries along `axis` do not "
        "sum to 1",
        "use the `axis` argument for both the max and the sum: e.sum(axis=axis, keepdims=True).",
        EQ_SOFTMAX),
    "sum_without_keepdims": KnownBug(
        "the sum is taken without keepdims=True, so broadcasting divides each entry by the sum of another row "
        "(silently, when the array is square)",
        "e / e.sum(axis=axis, keepdims=True): keepdims keeps the reduced axis in place for broadcasting.",
        EQ_SOFTMAX),
    "modifies_input": KnownBug(
        "your function changed one of its inputs in place (for example x -= x.max(...), or masked_fill_)",
        "work on new arrays: x = x - x.max(axis, keepdims=True) creates one; x -= ... overwrites the caller's data.",
        None),
    "full_score_matrix": KnownBug(
        "your function builds a whole L_q x L_kv array (the scores, the weights or a mask) at some point of the call, "
        "so its memory grows with L_q * L_kv instead of L_q times the tile width",
        "keep every L_q x L_kv quantity tile by tile: the row log-sum-exp by the online recurrence over key tiles "
        "(a running maximum and sum), the output and the gradients from P = exp(S_tile - LSE) recomputed per tile, "
        "and a mask only as a view (np.broadcast_to) sliced per tile.",
        EQ_FK_DS),
    "outputs_swapped": KnownBug(
        "your function returns the right arrays in the wrong order",
        "return them in the order of the signature: out, weights (attention, multi-head attention); out, k_cache, "
        "v_cache (a decode step); dq, dk, dv (the gradient).",
        None),
    # --- scaled dot-product attention -----------------------------------------------------------------------------
    "no_scale": KnownBug(
        "the scores are not scaled: softmax(QK^T) instead of softmax(QK^T / sqrt(d_k))",
        "multiply the scores by `scale`, and when scale is None use 1 / sqrt(d_k) with d_k = q.shape[-1]. Why: the "
        "variance of q . k grows like d_k (part I 'Why divide by √dₖ').",
        EQ_SCALED),
    "scale_d_k_not_sqrt": KnownBug(
        "the scores are divided by d_k instead of sqrt(d_k)",
        "scale = 1 / math.sqrt(d_k) (or d_k ** -0.5): it brings the variance d_k of q . k back to 1 "
        "(Eq. scaling-var-scaled).",
        EQ_SCALED),
    "scale_inverted": KnownBug(
        "the scores are multiplied by sqrt(d_k) instead of divided by it",
        "scores * d_k ** -0.5, or scores / d_k ** 0.5.",
        EQ_SCALED),
    "scale_d_v": KnownBug(
        "the scale uses d_v, the width of the values, instead of d_k, the width of the queries and keys",
        "d_k = q.shape[-1]; v.shape[-1] is d_v, which may differ (this case has d_v != d_k).",
        EQ_SCALED),
    "scale_seq_len": KnownBug(
        "the scale uses the number of keys L_kv (k.shape[-2]) instead of the key width d_k (k.shape[-1])",
        "d_k is the last axis: q.shape[-1]. Axis -2 is the sequence.",
        EQ_SCALED),
    "scale_ignored": KnownBug(
        "the `scale` argument is ignored: the scores are always multiplied by 1 / sqrt(d_k)",
        "scale = 1 / math.sqrt(d_k) if scale is None else scale.",
        EQ_SCALED),
    "scale_d_model": KnownBug(
        "the scores are scaled by 1/sqrt(d_model) instead of 1/sqrt(d_k) (the head size): the scores shrink by a "
        "further factor sqrt(n_heads) and the weights come out too flat",
        "scale by 1 / sqrt(head_dim), head_dim = W_q.shape[1] // n_heads (= q.shape[-1] after the split into heads). "
        "The dot product inside one head sums head_dim terms, so its variance is head_dim (Eq. scaling-var-scaled); "
        "d_model = n_heads * head_dim is the width of the whole layer. (This bug shipped in a widely watched "
        "lecture's code, C ** -0.5 with C the embedding width, and was fixed after a reader's pull request.)",
        EQ_SCALE_VARIANCE),
    "softmax_over_queries": KnownBug(
        "the softmax runs over the queries (axis -2) instead of over the keys (axis -1): the columns of the weights "
        "sum to 1 instead of the rows",
        "softmax(scores, axis=-1): each query gets its own distribution over the keys.",
        EQ_SOFTMAX),
    "mask_inverted": KnownBug(
        "the mask is used the wrong way round: True entries are blocked instead of allowed",
        "the book's convention is True = may attend: np.where(mask, scores, -np.inf) (torch: "
        "scores.masked_fill(~mask, float('-inf'))).",
        EQ_MASKED_SOFTMAX),
    "mask_fill_large_negative": KnownBug(
        "masked scores are set to a large negative number (like -1e9) instead of -inf, so a query row with no allowed "
        "key gets uniform weights over all its keys (and the average of all the values) instead of zero weights and "
        "a zero output",
        "after the softmax, zero the rows that have no allowed key: "
        "weights = np.where(mask.any(axis=-1, keepdims=True), weights, 0). The book's convention for an empty row is "
        "'attends to nothing': zero weights, zero output.",
        EQ_MASKED_SOFTMAX),
    "mask_nan_empty_rows": KnownBug(
        "a query row with no allowed key comes out NaN: with every score -inf, the softmax computes "
        "exp(-inf - (-inf)) or 0 / 0",
        "guard the empty rows: shift by a finite number where the row maximum is -inf, and divide only where the "
        "row sum is > 0 (np.divide(e, total, out=np.zeros_like(e), where=total > 0)), or zero those rows afterwards.",
        EQ_MASKED_SOFTMAX),
    "mask_fill_zero": KnownBug(
        "masked scores are set to 0 (for example scores * mask) instead of -inf, so masked keys still get weight",
        "a forbidden key must get weight exactly 0, i.e. score -inf: np.where(mask, scores, -np.inf).",
        EQ_MASKED_SOFTMAX),
    "mask_after_softmax": KnownBug(
        "the mask multiplies the weights after the softmax, without renormalising: the allowed weights no longer sum "
        "to 1",
        "mask the scores before the softmax (-inf where not allowed), so the softmax normalises over the allowed "
        "keys only.",
        EQ_MASKED_SOFTMAX),
    "mask_ignored": KnownBug(
        "the `mask` argument is ignored: every query attends to every key, allowed or not",
        "when mask is not None, set the scores of the forbidden keys to -inf before the softmax: "
        "np.where(mask, scores, -np.inf) (torch: scores.masked_fill(~mask, float('-inf'))); in multi-head attention, "
        "pass the mask on to the attention of every head.",
        EQ_MASKED_SOFTMAX),
    # --- heads: split, merge, the multi-head layer ----------------------------------------------------------------
    "split_no_transpose": KnownBug(
        "the heads are split with a reshape to (N, h, L, head_dim) and no transpose: 'head' i then holds a mixture "
        "of positions and column blocks, not X W_i^Q",
        "reshape to (N, L, h, head_dim) first (each position's row cut into h column blocks), then swap axes 1 and 2 "
        "(Theorem multihead-thm-fused).",
        EQ_FUSED),
    "split_strided": KnownBug(
        "the heads are split with head_dim as the outer axis (a reshape to (N, L, head_dim, h)): head i gets every "
        "h-th column instead of the column block i",
        "reshape to (N, L, h, head_dim): the heads are the contiguous column blocks of W^Q (Eq. multihead-blocks).",
        EQ_BLOCKS),
    "split_wrong_axes": KnownBug(
        "the split transposes the wrong axes: the result is (N, h, head_dim, L) (or another order), not "
        "(N, h, L, head_dim)",
        "y.reshape(N, L, h, head_dim), then swap only axes 1 and 2 (np.swapaxes(r, 1, 2) / r.transpose(1, 2)).",
        EQ_FUSED),
    "merge_no_transpose": KnownBug(
        "the heads are merged with a reshape and no transpose: reading (N, h, L, head_dim) as (N, L, h*head_dim) "
        "mixes positions across heads",
        "swap axes 1 and 2 back to (N, L, h, head_dim) first, then reshape to (N, L, h*head_dim).",
        EQ_MHA_OUTPUT),
    "merge_strided": KnownBug(
        "the heads are merged with head_dim as the outer axis: the concatenation interleaves the heads' columns "
        "instead of putting head i's output in column block i",
        "transpose to (N, L, h, head_dim), then reshape: Concat(head_1, ..., head_h) puts head_1's columns first "
        "(Eq. multihead-wo-blocks).",
        EQ_MHA_OUTPUT),
    "split_merge_no_transpose": KnownBug(
        "both the split into heads and the merge reshape without transposing: each 'head' mixes positions and "
        "column blocks",
        "split: reshape to (N, L, h, head_dim), then swap axes 1 and 2; merge: swap them back, then reshape "
        "(Theorem multihead-thm-fused).",
        EQ_FUSED),
    "view_non_contiguous": KnownBug(
        "torch's .view() was called on a non-contiguous tensor (after a transpose, or on an input that is itself a "
        "transposed view), and raised",
        "use .reshape(...), or .contiguous().view(...): a transpose changes the strides, not the memory.",
        EQ_FUSED),
    "no_output_projection": KnownBug(
        "the concatenated heads are returned without the output projection W^O (and b^O)",
        "finish with concat @ W_o (+ b_o): the heads are mixed by W^O (Eq. multihead-output).",
        EQ_MHA_OUTPUT),
    "missing_bias_o": KnownBug(
        "the output bias b_o is not added",
        "out = concat @ W_o + b_o when params has 'b_o'.",
        EQ_MHA_OUTPUT),
    "missing_bias_q": KnownBug(
        "the query bias b_q is not added",
        "Q = x_q @ W_q + b_q when params has 'b_q'.",
        EQ_MHA_PROJ),
    "missing_bias_v": KnownBug(
        "the value bias b_v is not added",
        "V = x_kv @ W_v + b_v when params has 'b_v'.",
        EQ_MHA_PROJ),
    "missing_input_biases": KnownBug(
        "the projection biases b_q, b_k, b_v are not added (b_o is)",
        "add each bias to its projection. (Leaving out b_k alone would change nothing: a key bias adds a constant to "
        "each query's row of scores, and the softmax ignores row constants.)",
        EQ_MHA_PROJ),
    "missing_biases": KnownBug(
        "none of the biases b_q, b_k, b_v, b_o is added",
        "params may hold biases: add b_q, b_k, b_v to the projections and b_o to the output when they are present.",
        EQ_MHA_PROJ),
    "values_from_W_k": KnownBug(
        "the values are projected with W_k (and b_k) instead of W_v",
        "V = x_kv @ W_v + b_v.",
        EQ_MHA_PROJ),
    "kv_from_x_q": KnownBug(
        "the keys and values are computed from x_q instead of x_kv (self-attention code used for cross-attention)",
        "K = x_kv @ W_k, V = x_kv @ W_v: queries come from x_q, keys and values from x_kv.",
        EQ_MHA_PROJ),
    "kv_map_tile": KnownBug(
        "the key/value heads are repeated in the wrong order (tiled): query head j reads key/value head j % g "
        "instead of j // (h/g)",
        "repeat each key/value head h/g times in place: np.repeat(k, n_rep, axis=1) or "
        "k.repeat_interleave(n_rep, dim=1), not np.tile or k.repeat(1, n_rep, 1, 1). Consecutive query heads form "
        "a group (Eq. gqa-map).",
        EQ_GQA_MAP),
    "weights_averaged_over_heads": KnownBug(
        "the weights are averaged over the heads, (N, L_q, L_kv), as torch.nn.MultiheadAttention does by default, "
        "instead of returned per head, (N, h, L_q, L_kv)",
        "return the weights of every head.",
        EQ_MHA_HEAD),
    # --- masks, repeat_kv, the KV cache -----------------------------------------------------------------------------
    "causal_top_left": KnownBug(
        "the causal mask is aligned top-left (query i sees keys 0..i) instead of bottom-right (query i sees keys "
        "0..L_kv - L_q + i): with a KV cache the L_q queries are the last positions of the L_kv keys",
        "np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q). Beware: torch's is_causal=True is top-left when "
        "L_q != L_kv.",
        EQ_CHUNK_MASK),
    "causal_strict": KnownBug(
        "the diagonal is masked too: a query cannot see its own position",
        "j <= L_kv - L_q + i includes equality: np.tril(..., k=l_kv - l_q), not k=l_kv - l_q - 1.",
        EQ_CHUNK_MASK),
    "causal_one_future_key": KnownBug(
        "the causal mask is off by one: each query also sees the key just after its own position "
        "(np.tril(..., k=l_kv - l_q + 1), or j <= i + 1)",
        "query i is position L_kv - L_q + i: it sees keys j <= L_kv - L_q + i, itself included and nothing after, "
        "np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q) (torch: .tril(diagonal=l_kv - l_q)).",
        EQ_CHUNK_MASK),
    "causal_inverted": KnownBug(
        "the mask is inverted: True marks the forbidden (future) keys",
        "True = may attend: the lower triangle (np.tril) is True; np.triu(..., k=1) is its complement.",
        EQ_CHUNK_MASK),
    "causal_transposed": KnownBug(
        "the mask is transposed: keys on the rows, or the upper triangle allowed (queries see the future)",
        "rows are queries, columns are keys: shape (l_q, l_kv), mask[i, j] = (j <= l_kv - l_q + i).",
        EQ_CHUNK_MASK),
    "mask_not_boolean": KnownBug(
        "the mask has the right pattern but holds numbers (1/0), not booleans",
        "dtype=bool: np.tril(np.ones((l_q, l_kv), dtype=bool), ...). A 0/1 number mask in np.where or as an index "
        "does something else.",
        EQ_CHUNK_MASK),
    "additive_mask": KnownBug(
        "the mask is additive (0 where allowed, -inf or a large negative number where not), not boolean",
        "return booleans, True = may attend; the additive form is an implementation detail of the softmax.",
        EQ_CHUNK_MASK),
    "repeat_wrong_axis": KnownBug(
        "the key/value heads are repeated along the wrong axis (the positions, or the batch)",
        "repeat along axis 1, the head axis: np.repeat(y, n_rep, axis=1).",
        EQ_GQA_MAP),
    "repeat_not_merged": KnownBug(
        "the result keeps a separate group axis, (N, g, n_rep, L, d), instead of (N, g*n_rep, L, d)",
        "merge the two axes: .reshape(N, g * n_rep, L, d), group-major, so that query head j reads kv head "
        "j // n_rep.",
        EQ_GQA_MAP),
    "no_causal_mask": KnownBug(
        "the new queries see all the new keys: no causal mask inside a chunk of several new positions",
        "when T > 1 positions arrive at once after c cached ones, query i may attend to key j iff j <= c + i "
        "(Eq. kv-chunk-mask); a single new position (T = 1) needs no mask.",
        EQ_CHUNK_MASK),
    "cache_prepended": KnownBug(
        "the new keys/values are put before the cached ones instead of after them",
        "np.concatenate([k_cache, k_new], axis=2): the cache keeps positions in order, oldest first.",
        EQ_KV_STEP),
    "new_position_not_attended": KnownBug(
        "the new queries attend to the cached keys only: the new positions' own keys and values are appended after "
        "the attention instead of before",
        "append first, then attend over [K_cache; k_new] (Eq. kv-step): a position attends to itself.",
        EQ_KV_STEP),
    "cache_not_updated": KnownBug(
        "the returned caches are the old ones: the new keys and values are not appended",
        "return k_all = concat([k_cache, k_new], axis=2) (and the same for v): the next step needs them.",
        EQ_KV_STEP),
    "cache_repeated_heads": KnownBug(
        "the returned cache holds the repeated heads (n_heads per position) instead of the n_kv_heads key/value "
        "heads, so it is n_heads / n_kv_heads times too large",
        "cache the n_kv_heads heads and repeat only the copies you attend with: GQA's point is the smaller cache "
        "(part II 'MQA and GQA').",
        EQ_KV_STEP),
    # --- online softmax -------------------------------------------------------------------------------------------
    "drop_last_partial_block": KnownBug(
        "the loop over key blocks skips the last block when L_kv is not a multiple of block_size",
        "for start in range(0, L_kv, block_size): k[..., start:start + block_size, :]; the last block is shorter "
        "(T = ceil(n / b) blocks).",
        EQ_ONLINE),
    "no_rescale_acc": KnownBug(
        "the accumulator is not rescaled by alpha = exp(m_old - m_new) when the running maximum grows",
        "acc = alpha * acc + P @ V_block: the old terms were computed relative to the old maximum.",
        EQ_ONLINE_ACC),
    "no_rescale_l": KnownBug(
        "the running sum l is not rescaled by alpha = exp(m_old - m_new) when the running maximum grows",
        "l = alpha * l + P.sum(axis=-1, keepdims=True).",
        EQ_ONLINE_L),
    "no_rescale": KnownBug(
        "neither the running sum l nor the accumulator is rescaled when the running maximum grows",
        "alpha = exp(m_old - m_new); l = alpha * l + rowsum(P); acc = alpha * acc + P @ V_block.",
        EQ_ONLINE_L),
    "alpha_inverted": KnownBug(
        "the rescaling factor is exp(m_new - m_old) instead of exp(m_old - m_new)",
        "alpha = exp(m_old - m_new) lies in [0, 1]: it shrinks the old terms when the maximum grows.",
        EQ_ONLINE_L),
    "no_final_division": KnownBug(
        "the output is the accumulator itself: it is never divided by the running sum l",
        "out = acc / l after the last block (Eq. online-final).",
        EQ_ONLINE_FINAL),
    "online_nan_empty_state": KnownBug(
        "a query whose first key block is fully masked gets NaN: while the running maximum is -inf, "
        "exp(s - m) = exp(-inf - (-inf)) = NaN",
        "shift by a finite number while the running maximum is still -inf: "
        "shift = np.where(np.isfinite(m_new), m_new, 0.0); every term is exp(-inf) = 0 anyway.",
        EQ_ONLINE_FINAL),
    # --- backward -------------------------------------------------------------------------------------------------
    "vjp_missing_rowsum": KnownBug(
        "the softmax backward is dS = A * dA: the term from -a a^T of the Jacobian, the row sum, is missing",
        "dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)).",
        EQ_SOFTMAX_VJP),
    "vjp_diagonal_only": KnownBug(
        "the softmax backward uses only the diagonal of the Jacobian: dS = A (1 - A) dA (the sigmoid's derivative)",
        "the off-diagonal entries -a_i a_j matter: J = diag(a) - a a^T, so dS = A * (dA - rowsum(dA * A)).",
        EQ_SOFTMAX_JAC),
    "vjp_rowsum_of_grad": KnownBug(
        "the row sum in the softmax backward is of dA alone, sum_j dA_j, instead of sum_j dA_j A_j",
        "dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)).",
        EQ_SOFTMAX_VJP),
    "vjp_sign": KnownBug(
        "the row-sum term of the softmax backward has the wrong sign: A * (dA + rowsum(dA * A))",
        "dS = A * (dA - rowsum(dA * A)), from J = diag(a) - a a^T.",
        EQ_SOFTMAX_VJP),
    "vjp_sum_without_keepdims": KnownBug(
        "the row sum is taken without keepdims, so broadcasting subtracts the sum of another row (silently, when "
        "the last two axes have the same length)",
        "(dA * A).sum(axis=-1, keepdims=True).",
        EQ_SOFTMAX_VJP),
    "vjp_sum_wrong_axis": KnownBug(
        "the sum of the softmax backward runs over axis -2 (a column) instead of the last axis (the row)",
        "the softmax normalised each row over the last axis, so its backward sums over the last axis too.",
        EQ_SOFTMAX_VJP),
    "grad_missing_scale": KnownBug(
        "dQ and dK miss the factor `scale`: dQ = dS K instead of scale * dS K (and the same for dK)",
        "S = scale * Q K^T, so the chain rule multiplies by scale once more: dQ = scale dS K, dK = scale dS^T Q.",
        EQ_DQ_DK),
    "grad_dv_no_transpose": KnownBug(
        "dV = A dO instead of A^T dO",
        "O = A V, so dV = A^T dO (Lemma bwd-lemma-matmul): it has V's shape (L_kv, d_v).",
        EQ_DV_DA),
    # --- part IV: RoPE ----------------------------------------------------------------------------------------------
    "rope_wrong_pairing": KnownBug(
        "the coordinates are paired the other convention's way: (x[2i], x[2i+1]) where rotate-half pairs "
        "(x[i], x[i + d/2]), or the reverse. Each convention is right for the checkpoints trained with it, and the two "
        "are not interchangeable (they differ by a permutation of the columns of W_q and W_k)",
        "style 'half' (Hugging Face's Llama, Qwen, Gemma, Mistral) pairs x[i] with x[i + d/2]: a, b = x[..., :d//2], "
        "x[..., d//2:]; style 'interleaved' (Meta's original Llama, GPT-J) pairs x[2i] with x[2i+1]: a, b = "
        "x[..., 0::2], x[..., 1::2]. The checkers take style= to say which one your function implements.",
        EQ_ROPE_ROTATION),
    "rope_angle_layout": KnownBug(
        "the two coordinates of a pair turn by different angles: the cos/sin tables are laid out for the other "
        "pairing (theta repeated pairwise, np.repeat / repeat_interleave, where the pairs are (x[i], x[i + d/2]), or "
        "the two halves [theta, theta] concatenated where the pairs are (x[2i], x[2i+1])), so the map is no longer "
        "a rotation",
        "both coordinates of pair i turn by m theta_i. Rotate-half: angles = np.concatenate([m theta, m theta], -1) "
        "(coordinates i and i + d/2 share theta_i); interleaved: np.repeat(m theta, 2, axis=-1) (coordinates 2i and "
        "2i+1 share theta_i).",
        EQ_ROPE_ROTATION),
    "rope_rotation_sign": KnownBug(
        "each pair turns by -m theta_i instead of +m theta_i: the sine terms have the wrong sign (for example "
        "rotate_half(x) = (x2, -x1) instead of (-x2, x1)). That is the inverse rotation, RoPE's backward pass",
        "(a, b) -> (a cos(m theta_i) - b sin(m theta_i), a sin(m theta_i) + b cos(m theta_i)); with rotate-half, "
        "x * cos + rotate_half(x) * sin where rotate_half(x) = np.concatenate([-x2, x1], -1).",
        EQ_ROPE_ROTATION),
    "rope_positions_ignored": KnownBug(
        "the `positions` argument is ignored: the vectors are rotated at positions 0, 1, ..., L - 1 (np.arange(L)) "
        "whatever positions were passed",
        "angles = positions[..., None] * theta: the positions may start after a KV cache, skip, or differ from one "
        "sequence to the next (positions of shape (N, 1, L)).",
        EQ_ROPE_ROTATION),
    "rope_freq_missing_2": KnownBug(
        "the frequencies are base^(-i/d) instead of base^(-2i/d): the exponent misses its factor 2 "
        "(np.arange(d // 2) / d), so the slowest pair turns about sqrt(base) times too fast",
        "theta_i = base ** (-2 * i / d) for i = 0 .. d/2 - 1, i.e. base ** (-np.arange(0, d, 2) / d).",
        EQ_ROPE_FREQ),
    "rope_freq_inverted": KnownBug(
        "the frequencies are base^(+2i/d): the exponent lost its minus sign, so the pairs turn faster and faster "
        "instead of slower and slower",
        "theta_i = base ** (-2i/d) = 1 / base ** (2i/d): pair 0 turns by one radian per position, the last pair by "
        "about 1/base.",
        EQ_ROPE_FREQ),
    "rope_base_ignored": KnownBug(
        "the `base` argument is ignored: the frequencies always use base 10000",
        "theta_i = base ** (-2i/d) with the base passed in (Llama 3 uses 500000: a larger base is how several models "
        "stretch their context).",
        EQ_ROPE_FREQ),
    "rope_no_position_offset": KnownBug(
        "the new positions are rotated as positions 0 .. T-1 instead of c .. c+T-1: the c cached positions are "
        "forgotten, so every decoding step rotates its query and key as if they were at the start of the sequence",
        "positions = c + np.arange(T) with c = k_cache.shape[2]: a token's position is its index in the whole "
        "sequence, cache included.",
        EQ_ROPE_CACHE),
    "rope_after_caching": KnownBug(
        "RoPE is applied after caching: the new keys go into the cache unrotated, so the returned cache holds raw "
        "keys (and where the whole cache [K_cache; k_new] is then rotated at positions 0 .. c+T-1 for the attention, "
        "the given cache, whose keys are already rotated, turns a second time)",
        "rotate k_new once, at its own positions, before appending it: the cache stores rotated keys R_n k_n, each "
        "turned at the position it was computed at and never again (Eq. rope-cache).",
        EQ_ROPE_CACHE),
    "rope_on_values": KnownBug(
        "the values are rotated too (RoPE applied to q, k and v): the output and the value cache come out rotated",
        "rotate q and k only. The position enters through the scores, <R_m q, R_n k> = <q, R_(n-m) k> "
        "(Eq. rope-relative); the values the weights average carry no position.",
        EQ_ROPE_RELATIVE),
    "rope_query_not_rotated": KnownBug(
        "the keys are rotated but the queries are not, so a score sees the key's absolute position instead of the "
        "distance n - m",
        "rotate the new queries at their positions c + i as well: the relative form <R_m q, R_n k> = <q, R_(n-m) k> "
        "needs both rotations.",
        EQ_ROPE_RELATIVE),
    "rope_key_not_rotated": KnownBug(
        "the queries are rotated but the new keys are not (they are attended and cached unrotated), so a score sees "
        "the query's absolute position instead of the distance n - m",
        "rotate k_new at its positions c + i before you attend and before you append it to the cache.",
        EQ_ROPE_RELATIVE),
    # --- part IV: sliding windows and attention sinks ----------------------------------------------------------------
    "window_one_key_too_many": KnownBug(
        "the window is off by one: each query sees window + 1 keys (j >= p - window, or p - j <= window), the "
        "convention that counts only the past keys (FlashAttention's window_size=(left, 0) is window = left + 1 here)",
        "query i sits at position p = l_kv - l_q + i and sees the keys p - window < j <= p: `window` keys, itself "
        "included (gpt-oss, Hugging Face). In NumPy: np.tril(ones, k=l_kv - l_q) & ~np.tril(ones, k=l_kv - l_q - "
        "window).",
        EQ_WINDOW_MASK),
    "window_one_key_too_few": KnownBug(
        "the window is off by one: each query sees only window - 1 keys (j > p - window + 1), itself and window - 2 "
        "earlier ones",
        "p - window < j <= p: `window` keys, the query's own included; window = 1 is attention to oneself.",
        EQ_WINDOW_MASK),
    "window_top_left": KnownBug(
        "the window is aligned top-left: query i is taken to sit at position i instead of l_kv - l_q + i, so after "
        "a KV cache the new queries look at the oldest keys",
        "the l_q queries are the last l_q of the l_kv positions: p = l_kv - l_q + i, as in the causal mask "
        "(Eq. kv-chunk-mask).",
        EQ_WINDOW_MASK),
    "window_not_causal": KnownBug(
        "only the window's lower bound is applied (j > p - window): the queries also see every future key",
        "the sliding window restricts the causal mask: both j <= p and j > p - window.",
        EQ_WINDOW_MASK),
    "window_symmetric": KnownBug(
        "the window is symmetric around the query, |p - j| < window (Longformer's local attention): the queries "
        "also see the next window - 1 keys",
        "a causal sliding window looks back only: p - window < j <= p.",
        EQ_WINDOW_MASK),
    "window_ignored": KnownBug(
        "the window is not applied: the mask is the plain causal mask, every query sees every earlier key",
        "add the lower bound j > p - window to the causal condition j <= p.",
        EQ_WINDOW_MASK),
    "sink_ignored": KnownBug(
        "the sink logit changes nothing: every row of the weights sums to 1, as without a sink (the sink is "
        "ignored, or added to every score of its row, which the softmax cancels, or its column is dropped and the "
        "rows renormalised)",
        "append the sink as one more column of the scores, take the softmax over the L_kv + 1 entries, then drop "
        "that column without renormalising: each row sums to 1 - p_sink (Eq. sink-softmax).",
        EQ_SINK_SOFTMAX),
    "sink_column_kept": KnownBug(
        "the sink is left in the output: the weights come back with the sink's column, L_kv + 1 columns instead of "
        "L_kv",
        "drop the sink's column after the softmax (probs[..., :-1] if you appended it last, probs[..., 1:] if "
        "first) and use the remaining L_kv columns for out = weights @ v.",
        EQ_SINK_SOFTMAX),
    "sink_scaled": KnownBug(
        "the sink logit is multiplied by the scale 1/sqrt(d_k) like the scores, but it is a logit of its own, not a "
        "dot product",
        "scale q k^T only, then append the sink logit as it is.",
        EQ_SINK_SOFTMAX),
    "sink_not_shifted": KnownBug(
        "the scores' exponentials are shifted by the row maximum but the sink's is not: the sum adds exp(sink) to "
        "sum_j exp(S_j - m), two terms on different scales",
        "shift every term of the row by the same number, the maximum over the scores and the sink: "
        "m = max(max_j S_j, sink), Z = sum_j exp(S_j - m) + exp(sink - m).",
        EQ_SINK_SOFTMAX),
    "sink_per_query": KnownBug(
        "the sink logits are indexed by the query instead of the head: broadcast along the wrong axis "
        "(sinks[:, None] against (..., L_q, L_kv) scores), query i gets sinks[i] (silently, when L_q equals the "
        "number of heads)",
        "one logit per head: sinks[:, None, None] against (N, h, L_q, L_kv) scores, a column of shape "
        "(N, h, L_q, 1) whose entries in head j all equal sinks[j].",
        EQ_SINK_SOFTMAX),
    # --- part IV: RMSNorm (QK-norm) -------------------------------------------------------------------------------
    "rmsnorm_subtracts_mean": KnownBug(
        "the mean is subtracted, (x - mean) / sqrt(var + eps) * w: that is LayerNorm (without its bias), not RMSNorm",
        "RMSNorm does not centre: y = x / sqrt(mean(x**2, axis=-1, keepdims=True) + eps) * weight.",
        EQ_RMSNORM),
    "rmsnorm_variance": KnownBug(
        "x is divided by sqrt(var(x) + eps), the standard deviation, instead of the root mean square "
        "sqrt(mean(x^2) + eps): the two differ whenever the mean of x is not 0",
        "mean(x**2), not x.var(): RMSNorm's statistic is taken around 0, not around the mean.",
        EQ_RMSNORM),
    "rmsnorm_sum_not_mean": KnownBug(
        "the squares are summed, not averaged: x / sqrt(sum(x^2) + eps) normalises to length 1, which is sqrt(d) "
        "times smaller than RMS 1",
        "np.mean(x**2, axis=-1, keepdims=True): the root *mean* square, so y has RMS 1 before the gain.",
        EQ_RMSNORM),
    "rmsnorm_eps_outside_sqrt": KnownBug(
        "eps is added after the square root, x / (sqrt(mean(x^2)) + eps), instead of under it",
        "x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps): the difference shows when the RMS of x is near "
        "sqrt(eps), as for small activations.",
        EQ_RMSNORM),
    "rmsnorm_eps_ignored": KnownBug(
        "the `eps` argument is ignored (a fixed eps, or none at all)",
        "use the eps passed in, under the square root; with none, a zero vector gives 0 / 0.",
        EQ_RMSNORM),
    "rmsnorm_one_plus_weight": KnownBug(
        "the gain is (1 + weight), Gemma's convention (its checkpoints store weight - 1), instead of weight",
        "y = x_hat * weight. Gemma's RMSNorm multiplies by (1 + weight) because its weights start at 0; a weight "
        "stored that way must be converted, not used as it is.",
        EQ_RMSNORM),
    "rmsnorm_no_weight": KnownBug(
        "the learned gain `weight` is never applied",
        "finish with * weight: one gain per coordinate, shared by every head.",
        EQ_RMSNORM),
    "rmsnorm_wrong_axis": KnownBug(
        "the mean of the squares is taken over another axis than the last (or over several axes, or the whole "
        "array): the vectors are not normalised one by one",
        "axis=-1, keepdims=True: QK-norm normalises each head's vector of head_dim coordinates on its own (OLMo 2's "
        "norm over all heads is applied before the split into heads, with a weight of size n_heads * head_dim).",
        EQ_RMSNORM),
    "rmsnorm_no_keepdims": KnownBug(
        "the mean is taken without keepdims=True, so broadcasting divides entry j by the RMS of another vector "
        "(silently, when the last two axes have the same length)",
        "np.mean(x**2, axis=-1, keepdims=True) keeps the reduced axis in place for broadcasting.",
        EQ_RMSNORM),
    # --- part IV: multi-head latent attention (an absorbed decoding step) ------------------------------------------
    "mla_rope_on_absorbed": KnownBug(
        "RoPE is applied to the part of the score that carries no position. Either q_nope is rotated at the query's "
        "position, which the layer never does (it rotates q_rope only; q_nope gets no rotation at all), or the "
        "absorbed query q_nope W_uk^T and every cached latent are rotated at their positions, so that a rotation "
        "that depends on the key's position sits between the query and W_uk, which no single absorbed matrix can "
        "hold",
        "rotate q_rope and k_rope only. The score of head i is (q_nope_i W_uk_i^T) c^T + (R q_rope_i)(R k_rope)^T: "
        "the first term has no rotation at all (that is what lets W_uk_i be absorbed, Proposition "
        "mla-prop-rope), the second carries the positions.",
        EQ_MLA_ABSORB_SCORE),
    "mla_cache_per_head": KnownBug(
        "the returned cache holds per-head tensors (the rebuilt keys c W_uk_i, the values c W_uv_i, or the shared "
        "rotary key copied to every head) instead of one latent and one rotary key per position: n_heads times "
        "what a head needs, and exactly what multi-head latent attention exists to avoid",
        "return the latents themselves, c_cache (N, P + T, d_c), and the rotated shared keys, k_rope_cache "
        "(N, P + T, d_r), P = c_cache.shape[1] being the cached positions: concatenate along axis 1. Every head "
        "reads the same cached rows; W_uk_i and W_uv_i are applied to the query and to the weighted sum, never to "
        "the cache (Eq. mla-cache).",
        EQ_MLA_CACHE),
    "mla_value_up_forgotten": KnownBug(
        "W_uv is never applied: out is the weighted sum of the latents, A_i C, of width d_c, instead of "
        "(A_i C) W_uv_i, of width d_v",
        "after the weighted sum of latents o_lat = weights @ c_all (N, h, T, d_c), multiply each head by its own "
        "value up-projection: np.einsum('nhtc,hcd->nhtd', o_lat, W_uv) (Eq. mla-absorb-out).",
        EQ_MLA_ABSORB_OUT),
    "mla_scale_nope_only": KnownBug(
        "the scores are scaled by 1/sqrt(d_n), the width of the no-position part alone, instead of "
        "1/sqrt(d_n + d_r), the width of a head's whole query and key",
        "each head's query and key have d_n + d_r coordinates (q_nope and q_rope side by side), so the scale is "
        "1 / sqrt(q_nope.shape[-1] + q_rope.shape[-1]), the same as the naive layer's.",
        EQ_MLA_HEAD),
    "mla_scale_latent_width": KnownBug(
        "the scores are scaled by 1/sqrt(d_c + d_r), the width of the absorbed query [q_nope W_uk^T, R q_rope] and "
        "of the cached rows [c, k_rope], instead of 1/sqrt(d_n + d_r)",
        "absorption computes the same score as the naive layer, q_i k_i^T, whose vectors have d_n + d_r "
        "coordinates, so the scale stays 1 / sqrt(d_n + d_r) (Eq. mla-decode-step), whatever the width of the "
        "vectors you multiply.",
        EQ_MLA_DECODE),
    "mla_no_position_offset": KnownBug(
        "the new positions are rotated as positions 0 .. T-1 instead of P .. P+T-1: the P cached positions are "
        "forgotten, so every step rotates its q_rope and k_rope as if it were at the start of the sequence",
        "positions = P + np.arange(T) with P = c_cache.shape[1]: a token's position counts the cached ones.",
        EQ_MLA_DECODE),
    "mla_cache_not_updated": KnownBug(
        "the returned caches are the old ones: the new latents and rotary keys are not appended",
        "return np.concatenate([c_cache, c_new], axis=1) and the same for the rotated k_rope: the next step reads "
        "them.",
        EQ_MLA_DECODE),
    # --- part IV: gated attention (the output gate before W^O) -------------------------------------------------------
    "gate_missing": KnownBug(
        "there is no gate: the output is the plain layer's Concat(head_1, ..., head_h) W^O + b^O, no head's output "
        "multiplied by sigmoid(x_q W_gate + b_gate)",
        "after the attention and before the merge, multiply each head's output (N, h, L_q, head_dim) by its gate: "
        "G = sigmoid(x_q @ W_gate + b_gate), (N, L_q, h) headwise or (N, L_q, h*head_dim) elementwise, laid out "
        "like the heads (Eq. gate-layer).",
        EQ_GATE_LAYER),
    "gate_no_sigmoid": KnownBug(
        "the sigmoid is missing: the gate's logits x_q W_gate + b_gate multiply the heads' outputs directly, so the "
        "'gate' is unbounded and can be negative",
        "G = 1 / (1 + np.exp(-(x_q @ W_gate + b_gate))): every gate value lies between 0 and 1, and a head's output "
        "is only ever scaled down (Eq. gate-layer).",
        EQ_GATE_LAYER),
    "gate_silu": KnownBug(
        "the gate is SiLU(a) = a * sigmoid(a) (the gate of a SwiGLU feed-forward network) instead of sigmoid(a)",
        "the output gate is the sigmoid itself, G = sigmoid(x_q @ W_gate + b_gate), between 0 and 1; SiLU's extra "
        "factor a makes it unbounded and negative for a < 0.",
        EQ_GATE_LAYER),
    "gate_bias_ignored": KnownBug(
        "b_gate is not added: the gate is sigmoid(x_q W_gate) instead of sigmoid(x_q W_gate + b_gate)",
        "when params has 'b_gate', add it to the logits before the sigmoid (it has the gate's width: h or "
        "h*head_dim).",
        EQ_GATE_LAYER),
    "gate_after_output_projection": KnownBug(
        "the gate multiplies the layer's output after W^O (before or after b^O) instead of each head's output "
        "before W^O",
        "gate first, then merge and project: Z = heads * G (N, h, L_q, head_dim), out = merge(Z) @ W_o + b_o. W^O "
        "mixes the coordinates of all heads, so a gate after it is another function (Eq. gate-layer).",
        EQ_GATE_LAYER),
    "gate_on_attention_weights": KnownBug(
        "the headwise gate multiplies the attention weights instead of the heads' outputs: the output comes out "
        "the same ((g A) V = g (A V)), but the weights returned are gated and their rows no longer sum to 1",
        "leave the weights alone and gate the outputs A_i V_i; return the softmax's weights, ungated.",
        EQ_GATE_LAYER),
    "gate_on_values": KnownBug(
        "each value v_j is multiplied by the gate of its own key position, sigmoid(x_kv[j] W_gate + b_gate), before "
        "the weighted sum, instead of each query's output row by the gate of that query",
        "the gate belongs to the query: multiply row i of head i's output, sum_j a_ij v_j, by "
        "sigmoid(x_q[i] W_gate + b_gate). A gate on the values depends on the keys' tokens, not on the query's "
        "(Eq. gate-layer).",
        EQ_GATE_LAYER),
    "gate_from_kv_input": KnownBug(
        "the gate is computed from the keys' and values' input x_kv instead of the queries' input x_q (the same "
        "thing in self-attention; in cross-attention query i then gets the gate of key position i)",
        "G = sigmoid(x_q @ W_gate + b_gate): one gate per query position, from the query side (Eq. gate-layer).",
        EQ_GATE_LAYER),
    "gate_from_output": KnownBug(
        "the gate is computed from an output of the attention (the concatenated heads, or the ungated layer "
        "output) instead of from the layer's input x_q",
        "the gate reads the same input as the queries, G = sigmoid(x_q @ W_gate + b_gate), and does not depend on "
        "the attention at all; it multiplies the heads' output Y, it is not computed from it.",
        EQ_GATE_LAYER),
    "gate_tiled": KnownBug(
        "the headwise gate is widened to the concatenated heads with np.tile, so coordinate c of the concatenation "
        "gets the gate of head c mod n_heads instead of head c // head_dim",
        "a headwise gate multiplies every coordinate of its own head: np.repeat(G, head_dim, axis=-1) against the "
        "concatenation, or G.transpose(0, 2, 1)[..., None] against the (N, h, L_q, head_dim) heads.",
        EQ_GATE_LAYER),
    "gate_split_no_transpose": KnownBug(
        "the gate (N, L_q, n_heads) or (N, L_q, n_heads*head_dim) meets the (N, n_heads, L_q, head_dim) heads "
        "without its head axis moved in front of the positions (a reshape to (N, n_heads, L_q, .) without the "
        "transpose, or G[..., None] for a headwise gate, which broadcasts silently when L_q = n_heads): positions "
        "and heads are mixed, as in the split-heads bug",
        "split the gate like the queries: G.reshape(N, L_q, h, -1).transpose(0, 2, 1, 3), which is (N, h, L_q, 1) "
        "headwise and (N, h, L_q, head_dim) elementwise.",
        EQ_GATE_LAYER),
}

# Hints for exceptions, keyed on a fragment of the exception's message (behaviour, not source code): a hint's
# text, or the id of a known bug.
ERROR_HINTS = (
    ("view size is not compatible", "view_non_contiguous"),
    ("could not be broadcast", "A broadcasting error: usually a reduction (sum, max) without keepdims=True, or "
                               "arrays whose axes are in a different order than you think."),
    ("must match the size of tensor", "A broadcasting error: usually a reduction (sum, max) without keepdim=True, "
                                      "or tensors whose axes are in a different order than you think."),
    ("matmul", "A matrix-product shape error: transpose only the last two axes of k (np.swapaxes(k, -1, -2), "
               "k.transpose(-2, -1)); k.T reverses every axis of a batched array."),
    ("cannot be multiplied", "A matrix-product shape error: check which axes you transpose (k.T reverses every "
                             "axis of a batched array; use k.transpose(-2, -1))."),
    ("cannot reshape", "A reshape error: check the sizes you reshape to against the shapes in the case name."),
    ("shape '[", "A reshape/view error: check the sizes you reshape to against the shapes in the case name."),
)
