"""The checkers' messages in Chinese (``mha.exercises.language``): each English text a message can show, and its
Chinese. Numbers, code and ``{placeholders}`` are those of the English (tests/test_exercises_language.py checks it
and that every text has its entry)."""

MESSAGES: dict[str, str] = {
    ' ({equation})':
        '（{equation}）',
    '    (your function returned ({returned}) instead of ({expected}))\n':
        '    （你的函数返回的是 ({returned})，而不是 ({expected})）\n',
    '    expected {label} = {expected}\n    got      {label} = {actual}\n':
        '    期望 {label} = {expected}\n    实际 {label} = {actual}\n',
    '    expected {name} = {expected}, got {actual}\n':
        '    期望 {name} = {expected}，实际为 {actual}\n',
    '    expected {name} of shape {expected}, got shape {actual}\n':
        '    期望 {name} 的形状为 {expected}，实际形状为 {actual}\n',
    ' (inputs: torch float64 tensors)':
        ' （输入：torch float64 张量）',
    ' Your {name} contains NaN or inf: look for exp of a large number (subtract the maximum), a division by zero (rows with no allowed key), or -inf - (-inf).':
        ' 你的 {name} 中含有 NaN 或 inf：检查是否对很大的数取了 exp（应先减去最大值）、是否除以了零（没有可关注键的行），或者是否出现了 -inf - (-inf)。',
    ' at {file}, line {line}':
        ' 停在 {file} 第 {line} 行',
    '(a, b) -> (a cos(m theta_i) - b sin(m theta_i), a sin(m theta_i) + b cos(m theta_i)); with rotate-half, x * cos + rotate_half(x) * sin where rotate_half(x) = np.concatenate([-x2, x1], -1).':
        '(a, b) -> (a cos(m theta_i) - b sin(m theta_i), a sin(m theta_i) + b cos(m theta_i))；在 rotate-half 约定下，就是 x * cos + rotate_half(x) * sin，其中 rotate_half(x) = np.concatenate([-x2, x1], -1)。',
    '(dA * A).sum(axis=-1, keepdims=True).':
        '行和要写成 (dA * A).sum(axis=-1, keepdims=True)。',
    '; and ':
        '；而',
    'A * (dA - rowsum(dA * A))':
        'A * (dA - rowsum(dA * A))',
    'A broadcasting error: usually a reduction (sum, max) without keepdim=True, or tensors whose axes are in a different order than you think.':
        '广播错误：通常是做归约（sum、max）时没有加 keepdim=True，或者张量的轴顺序与你以为的不同。',
    'A broadcasting error: usually a reduction (sum, max) without keepdims=True, or arrays whose axes are in a different order than you think.':
        '这是一个广播错误：通常是做归约（sum、max）时没有加 keepdims=True，或者数组的轴顺序与你以为的不同。',
    'A headwise gate is (N, L_q, h): move its head axis before it meets the (N, h, L_q, head_dim) heads, G.transpose(0, 2, 1)[..., None].':
        '逐头门控的形状是 (N, L_q, h)：在它与形状为 (N, h, L_q, head_dim) 的各头相乘之前，先把它的头轴移到前面，即 G.transpose(0, 2, 1)[..., None]。',
    'A matrix-product shape error: check which axes you transpose (k.T reverses every axis of a batched array; use k.transpose(-2, -1)).':
        '这是一个矩阵乘积的形状错误：检查你转置的是哪些轴（k.T 会把带批量轴的数组的所有轴都反过来；应使用 k.transpose(-2, -1)）。',
    'A matrix-product shape error: transpose only the last two axes of k (np.swapaxes(k, -1, -2), k.transpose(-2, -1)); k.T reverses every axis of a batched array.':
        '矩阵乘积的形状错误：只转置 k 的最后两个轴（np.swapaxes(k, -1, -2)、k.transpose(-2, -1)）；对带批量轴的数组，k.T 会把所有轴的顺序都反过来。',
    'A query row with no allowed key gets zero weights and a zero head output; gated, it stays zero, so its output row is b_o.':
        '没有可关注键的查询行，权重全为零，头输出也为零；经过门控后仍然为零，所以它的输出行就是 b_o。',
    'A query row with no allowed key gets zero weights; its output row is then b_o.':
        '没有可关注键的查询行得到全零权重；于是它的输出行就是 b_o。',
    'A reshape error: check the sizes you reshape to against the shapes in the case name.':
        'reshape 出错：把你 reshape 的目标大小与用例名称中的形状逐一核对。',
    'A reshape/view error: check the sizes you reshape to against the shapes in the case name.':
        '这是一个 reshape/view 错误：把你 reshape 的目标大小与用例名称中的形状对照检查。',
    'A row with no allowed key has zero weights, so it contributes zero gradient.':
        '没有可关注键的行权重全为零，因此它贡献的梯度为零。',
    "A row with no allowed key must give zero weights and a zero output row (the book's convention), never NaN and never uniform weights.":
        '没有可关注键的行必须得到全零权重和全零输出行（本书的约定），既不能是 NaN，也不能是均匀权重。',
    'A row with no allowed key puts all its weight on the sink: zero weights, a zero output row.':
        '没有可关注键的行把全部权重都放在汇聚点上：权重全为零，输出行全为零。',
    'A zero vector stays zero: eps under the square root keeps 0 / 0 away.':
        '零向量仍然是零向量：平方根下的 eps 避免了 0 / 0。',
    'A^T dO':
        'A^T dO',
    'About this case: {note}':
        '关于这个用例：{note}',
    "Concat(Y_1 * G_1, ..., Y_h * G_h) W^O + b^O with G = sigmoid(x_q W_gate + b_gate), each head's output gated before W^O":
        'Concat(Y_1 * G_1, ..., Y_h * G_h) W^O + b^O，其中 G = sigmoid(x_q W_gate + b_gate)，每个头的输出在 W^O 之前经过门控',
    'Concat(head_1, ..., head_h) W^O + b^O':
        'Concat(head_1, ..., head_h) W^O + b^O',
    'Concat(head_1, ..., head_h): y with axes 1 and 2 swapped, reshaped to (N, L, h*head_dim)':
        'Concat(head_1, ..., head_h)：把 y 的轴 1 和轴 2 交换，再重塑为 (N, L, h*head_dim)',
    "G = 1 / (1 + np.exp(-(x_q @ W_gate + b_gate))): every gate value lies between 0 and 1, and a head's output is only ever scaled down (Eq. gate-layer).":
        'G = 1 / (1 + np.exp(-(x_q @ W_gate + b_gate)))：每个门控值都在 0 和 1 之间，头的输出只会被缩小（公式 gate-layer）。',
    'G = sigmoid(x_q @ W_gate + b_gate): one gate per query position, from the query side (Eq. gate-layer).':
        'G = sigmoid(x_q @ W_gate + b_gate)：每个查询位置一个门控，来自查询一侧（公式 gate-layer）。',
    'GQA':
        'GQA',
    'GQA (groups of {0})':
        'GQA（每组 {0} 个查询头）',
    'Here eps is as large as mean(x^2): where you add it matters.':
        '这里 eps 与 mean(x^2) 一样大：它加在哪里会影响结果。',
    'Here head_dim = 6, not d_model / n_heads = 4: read it from the weights, head_dim = W_q.shape[1] // n_heads. W_o is (n_heads*head_dim, d_model) = (12, 8).':
        '这里 head_dim = 6，而不是 d_model / n_heads = 4：请从权重中读出它，head_dim = W_q.shape[1] // n_heads。W_o 的形状是 (n_heads*head_dim, d_model) = (12, 8)。',
    'Here head_dim = 6, not d_model / n_heads = 4: read it from the weights, head_dim = W_q.shape[1] // n_heads; W_gate is (d_model, n_heads*head_dim) = (8, 12).':
        '这里 head_dim = 6，而不是 d_model / n_heads = 4：要从权重中读出它，head_dim = W_q.shape[1] // n_heads；W_gate 的形状是 (d_model, n_heads*head_dim) = (8, 12)。',
    "Hint: replace the stub's `raise NotImplementedError` with your code.":
        '提示：把函数桩中的 `raise NotImplementedError` 换成你的代码。',
    'Hint: {hint}\n':
        '提示：{hint}\n',
    'K = x_kv @ W_k, V = x_kv @ W_v: queries come from x_q, keys and values from x_kv.':
        'K = x_kv @ W_k，V = x_kv @ W_v：查询来自 x_q，键和值来自 x_kv。',
    'L_kv = {0} not a multiple of block_size (the last block has {1} key)':
        'L_kv = {0} 不是 block_size 的整数倍（最后一个分块只有 {1} 个键）',
    'L_kv a multiple of block_size':
        'L_kv 是 block_size 的整数倍',
    'MQA':
        'MQA',
    'New query i is position c + i: it sees keys j <= c + i (bottom-right causal mask).':
        '新查询 i 位于位置 c + i：它能看到 j <= c + i 的键（右下对齐的因果掩码）。',
    'New query i sits at position c + i: rotate it (and its key) there, and let it see the keys j <= c + i.':
        '新查询 i 位于位置 c + i：要在这个位置上旋转它（以及它的键），并让它看到键 j <= c + i。',
    'New query t sits at position P + t, P the cached positions: rotate its q_rope (and its k_rope) there, and let it see the rows j <= P + t.':
        '新查询 t 位于位置 P + t，P 为缓存位置数：要在这个位置上旋转它的 q_rope（以及它的 k_rope），并让它看到 j <= P + t 的各行。',
    "O = A V, so dV = A^T dO (Lemma bwd-lemma-matmul): it has V's shape (L_kv, d_v).":
        'O = A V，所以 dV = A^T dO（引理 bwd-lemma-matmul）：它的形状与 V 相同，为 (L_kv, d_v)。',
    "One sink logit per head: in (N, h, L_q, L_kv) scores, head j's rows all get sinks[j].":
        '每个头一个汇聚点 logit：在形状为 (N, h, L_q, L_kv) 的分数中，头 j 的所有行都使用 sinks[j]。',
    'Positions need not start at 0: after c cached tokens the new ones sit at c, c + 1, ...':
        '位置不一定从 0 开始：在 c 个已缓存的词元之后，新词元位于 c, c + 1, ...',
    "Q = x_q @ W_q + b_q when params has 'b_q'.":
        "当 params 中有 'b_q' 时，Q = x_q @ W_q + b_q。",
    'RMSNorm does not centre: y = x / sqrt(mean(x**2, axis=-1, keepdims=True) + eps) * weight.':
        'RMSNorm 不做中心化：y = x / sqrt(mean(x**2, axis=-1, keepdims=True) + eps) * weight。',
    'RoPE is applied after caching: the new keys go into the cache unrotated, so the returned cache holds raw keys (and where the whole cache [K_cache; k_new] is then rotated at positions 0 .. c+T-1 for the attention, the given cache, whose keys are already rotated, turns a second time)':
        'RoPE 在写入缓存之后才施加：新的键未经旋转就进入了缓存，因此返回的缓存中存的是原始的键（而如果随后为了做注意力把整个缓存 [K_cache; k_new] 按位置 0 .. c+T-1 旋转，传入的缓存中本已旋转过的键就会再被旋转一次）',
    "RoPE is applied to the part of the score that carries no position. Either q_nope is rotated at the query's position, which the layer never does (it rotates q_rope only; q_nope gets no rotation at all), or the absorbed query q_nope W_uk^T and every cached latent are rotated at their positions, so that a rotation that depends on the key's position sits between the query and W_uk, which no single absorbed matrix can hold":
        'RoPE 被施加到了分数中不携带位置的那一部分上。要么是 q_nope 在查询的位置上被旋转了，而这一层从不这样做（它只旋转 q_rope；q_nope 完全不旋转）；要么是吸收后的查询 q_nope W_uk^T 和每个缓存的潜在向量都在各自的位置上被旋转了，于是一个依赖于键位置的旋转夹在查询与 W_uk 之间，而任何单个吸收后的矩阵都无法容纳这样的旋转',
    'S = scale * Q K^T, so the chain rule multiplies by scale once more: dQ = scale dS K, dK = scale dS^T Q.':
        'S = scale * Q K^T，所以链式法则还要再乘一次 scale：dQ = scale dS K，dK = scale dS^T Q。',
    'Subtract the row maximum in the forward softmax.':
        '在前向传播的 softmax 中减去行最大值。',
    'The caches have 0 positions: np.concatenate of an empty (N, g, 0, head_dim) array works.':
        '缓存中有 0 个位置：对空的 (N, g, 0, head_dim) 数组做 np.concatenate 没有问题。',
    'The first case with batch axes: transpose only the last two axes of k (np.swapaxes(k, -1, -2), k.transpose(-2, -1)); k.T reverses all of them. Matrix products act on the last two axes.':
        '这是第一个带批量轴的用例：只转置 k 的最后两个轴（np.swapaxes(k, -1, -2)、k.transpose(-2, -1)）；k.T 会把所有轴的顺序都反过来。矩阵乘积作用在最后两个轴上。',
    'The gate has one column block per *query* head (n_heads*head_dim columns), even when the key/value heads are shared.':
        '门控为每个*查询*头各设一个列块（共 n_heads*head_dim 列），即使键/值头是共享的也是如此。',
    "The gate of query i is computed from x_q[:, i], the queries' input, never from x_kv.":
        '查询 i 的门控由查询的输入 x_q[:, i] 计算得到，绝不是由 x_kv 计算。',
    'The mask has shape (N, 1, 1, L_kv): it broadcasts over the heads and the queries.':
        '掩码的形状为 (N, 1, 1, L_kv)：它沿头轴和查询轴广播。',
    'The query is position 8, the last of the 9: it sees keys 5, 6, 7, 8.':
        '该查询位于位置 8，是 9 个位置中的最后一个：它看到键 5、6、7、8。',
    'This matches a known bug: {description}{where}.\nHint: {hint}':
        '这与一个已知错误相符：{description}{where}。\n提示：{hint}',
    'This matches none of the known bugs this checker simulates.':
        '这与本检验函数模拟的任何已知错误都不相符。',
    'True = may attend: the lower triangle (np.tril) is True; np.triu(..., k=1) is its complement.':
        'True 表示可以关注：下三角（np.tril）为 True；np.triu(..., k=1) 是它的补集。',
    "V = x_kv @ W_v + b_v when params has 'b_v'.":
        "当 params 含有 'b_v' 时，V = x_kv @ W_v + b_v。",
    'V = x_kv @ W_v + b_v.':
        'V = x_kv @ W_v + b_v。',
    'W_uv is never applied: out is the weighted sum of the latents, A_i C, of width d_c, instead of (A_i C) W_uv_i, of width d_v':
        '从未应用 W_uv：out 是潜在向量的加权和 A_i C，宽度为 d_c，而不是宽度为 d_v 的 (A_i C) W_uv_i',
    'Where to look: Eq. {label} ({chapter}).':
        '请查阅：公式 {label}（{chapter}）。',
    'While every key seen so far is masked the state is (m, l, acc) = (-inf, 0, 0); a query with no allowed key at all returns a zero row.':
        '只要目前见过的每个键都被掩蔽，状态就是 (m, l, acc) = (-inf, 0, 0)；完全没有可关注键的查询返回全零的一行。',
    'With empty caches the new positions are 0 .. T-1; the returned caches hold the T latents and the T rotated rotary keys.':
        '缓存为空时，新位置为 0 .. T-1；返回的缓存中保存这 T 个潜在向量和 T 个已旋转的旋转键。',
    'With empty caches the new positions are 0 .. T-1; the returned key cache holds the rotated keys.':
        '缓存为空时，新位置为 0 .. T-1；返回的键缓存保存的是旋转后的键。',
    '[K_cache; R k_new]: the new keys rotated at their positions, appended along axis 2':
        '[K_cache; R k_new]：新的键在各自的位置上旋转后，沿轴 2 追加',
    '[K_cache; k_new] (new positions appended along axis 2)':
        '[K_cache; k_new]（新位置沿轴 2 追加）',
    '[V_cache; v_new] (new positions appended along axis 2)':
        '[V_cache; v_new]（新位置沿轴 2 追加）',
    '[V_cache; v_new]: the values, not rotated, appended along axis 2':
        '[V_cache; v_new]：值不做旋转，沿轴 2 追加',
    '[c_cache; c_new]: the new latents appended along axis 1':
        '[c_cache; c_new]：新的潜在向量沿轴 1 追加',
    '[k_rope_cache; R k_rope_new]: the new rotary keys rotated at their positions, appended along axis 1':
        '[k_rope_cache; R k_rope_new]：新的旋转键按各自的位置旋转后，沿轴 1 追加',
    'a batch of one':
        '批量大小为一',
    'a causal sliding window looks back only: p - window < j <= p.':
        '因果滑动窗口只往回看：p - window < j <= p。',
    'a chunk (L_q != L_kv)':
        '一个分块（L_q != L_kv）',
    'a chunk after a cache':
        '已有缓存之后的一段新位置',
    'a chunk of {0} new queries after {1} cached positions':
        '已缓存 {1} 个位置之后，一个含 {0} 个新查询的分块',
    'a forbidden key must get weight exactly 0, i.e. score -inf: np.where(mask, scores, -np.inf).':
        '被禁止的键的权重必须恰好为 0，即分数为 -inf：np.where(mask, scores, -np.inf)。',
    'a headwise gate multiplies every coordinate of its own head: np.repeat(G, head_dim, axis=-1) against the concatenation, or G.transpose(0, 2, 1)[..., None] against the (N, h, L_q, head_dim) heads.':
        '逐头门控要乘到它所属头的每一个坐标上：对拼接结果用 np.repeat(G, head_dim, axis=-1)，或者对形状为 (N, h, L_q, head_dim) 的各头用 G.transpose(0, 2, 1)[..., None]。',
    'a large eps':
        '很大的 eps',
    'a long context':
        '长上下文',
    'a query row with no allowed key comes out NaN: with every score -inf, the softmax computes exp(-inf - (-inf)) or 0 / 0':
        '没有可关注键的查询行输出为 NaN：所有分数都是 -inf 时，softmax 计算的是 exp(-inf - (-inf)) 或 0 / 0',
    'a query whose first key block is fully masked gets NaN: while the running maximum is -inf, exp(s - m) = exp(-inf - (-inf)) = NaN':
        '第一个键分块被完全掩蔽的查询得到了 NaN：运行最大值还是 -inf 时，exp(s - m) = exp(-inf - (-inf)) = NaN',
    'a rectangular matrix':
        '一个非方阵',
    'a small window':
        '较小的窗口',
    'a square matrix':
        '方阵',
    'a vector':
        '向量',
    'a whole decode':
        '一次完整的解码',
    "a whole decode of a layer's attention":
        '一层注意力的完整解码',
    'a window as long as the sequence (the causal mask)':
        '窗口与序列一样长（即因果掩码）',
    'a window longer than the sequence (the causal mask)':
        '窗口比序列更长（即因果掩码）',
    'a {kind} of {n} values':
        '一个含 {n} 个值的 {kind}',
    'absorption computes the same score as the naive layer, q_i k_i^T, whose vectors have d_n + d_r coordinates, so the scale stays 1 / sqrt(d_n + d_r) (Eq. mla-decode-step), whatever the width of the vectors you multiply.':
        '吸收计算的分数与朴素层相同，都是 q_i k_i^T，其中的向量有 d_n + d_r 个坐标，所以无论你相乘的向量有多宽，缩放因子都保持为 1 / sqrt(d_n + d_r)（公式 mla-decode-step）。',
    'acc = alpha * acc + P @ V_block: the old terms were computed relative to the old maximum.':
        'acc = alpha * acc + P @ V_block：旧的项是相对于旧的最大值计算的。',
    "add each bias to its projection. (Leaving out b_k alone would change nothing: a key bias adds a constant to each query's row of scores, and the softmax ignores row constants.)":
        '把每个偏置加到它对应的投影上。（只漏掉 b_k 不会改变任何结果：键偏置给每个查询的那一行分数加上同一个常数，而 softmax 不受行内常数的影响。）',
    'add the lower bound j > p - window to the causal condition j <= p.':
        '在因果条件 j <= p 之外再加上下界 j > p - window。',
    "after the attention and before the merge, multiply each head's output (N, h, L_q, head_dim) by its gate: G = sigmoid(x_q @ W_gate + b_gate), (N, L_q, h) headwise or (N, L_q, h*head_dim) elementwise, laid out like the heads (Eq. gate-layer).":
        '在注意力之后、合并各头之前，把每个头的输出 (N, h, L_q, head_dim) 乘以它的门控：G = sigmoid(x_q @ W_gate + b_gate)，逐头时形状为 (N, L_q, h)，逐元素时为 (N, L_q, h*head_dim)，排布方式与各头相同（公式 gate-layer）。',
    "after the softmax, zero the rows that have no allowed key: weights = np.where(mask.any(axis=-1, keepdims=True), weights, 0). The book's convention for an empty row is 'attends to nothing': zero weights, zero output.":
        '在 softmax 之后，把没有可关注键的行置零：weights = np.where(mask.any(axis=-1, keepdims=True), weights, 0)。本书对空行的约定是“什么都不关注”：权重为零，输出为零。',
    "after the weighted sum of latents o_lat = weights @ c_all (N, h, T, d_c), multiply each head by its own value up-projection: np.einsum('nhtc,hcd->nhtd', o_lat, W_uv) (Eq. mla-absorb-out).":
        "求出潜在向量的加权和 o_lat = weights @ c_all (N, h, T, d_c) 之后，让每个头乘以它自己的值上投影：np.einsum('nhtc,hcd->nhtd', o_lat, W_uv)（公式 mla-absorb-out）。",
    'alpha = exp(m_old - m_new) lies in [0, 1]: it shrinks the old terms when the maximum grows.':
        'alpha = exp(m_old - m_new) 落在 [0, 1] 中：最大值增大时，它把旧的项缩小。',
    'alpha = exp(m_old - m_new); l = alpha * l + rowsum(P); acc = alpha * acc + P @ V_block.':
        'alpha = exp(m_old - m_new)；l = alpha * l + rowsum(P)；acc = alpha * acc + P @ V_block。',
    '({parts})':
        '（{parts}）',
    '; ':
        '；',
    'also wrong: {names}':
        '同样有误：{names}',
    'angles = positions[..., None] * theta: the positions may start after a KV cache, skip, or differ from one sequence to the next (positions of shape (N, 1, L)).':
        'angles = positions[..., None] * theta：位置可以从键值缓存之后开始，可以跳跃，也可以因序列而异（positions 的形状为 (N, 1, L)）。',
    'append first, then attend over [K_cache; k_new] (Eq. kv-step): a position attends to itself.':
        '先追加，再在 [K_cache; k_new] 上做注意力（公式 kv-step）：一个位置也会关注它自己。',
    'append the sink as one more column of the scores, take the softmax over the L_kv + 1 entries, then drop that column without renormalising: each row sums to 1 - p_sink (Eq. sink-softmax).':
        '把汇聚点作为额外的一列追加到分数上，在这 L_kv + 1 个项上做 softmax，然后丢掉这一列，不要重新归一化：每一行之和为 1 - p_sink（公式 sink-softmax）。',
    "axis=-1, keepdims=True: QK-norm normalises each head's vector of head_dim coordinates on its own (OLMo 2's norm over all heads is applied before the split into heads, with a weight of size n_heads * head_dim).":
        'axis=-1, keepdims=True：QK 归一化对每个头的 head_dim 维向量单独做归一化（OLMo 2 在所有头上共用的归一化是在拆分成各个头之前做的，其权重大小为 n_heads * head_dim）。',
    'b_gate is not added: the gate is sigmoid(x_q W_gate) instead of sigmoid(x_q W_gate + b_gate)':
        '没有加上 b_gate：门控是 sigmoid(x_q W_gate)，而不是 sigmoid(x_q W_gate + b_gate)',
    "base {0} (Llama {1}'s)":
        'base {0}（Llama {1} 的取值）',
    'batch and head axes':
        '批量轴和头轴',
    'batch and head axes (L_q = h = {0})':
        '批量轴和头轴（L_q = h = {0}）',
    'biases':
        '偏置',
    'block_size larger than L_kv (one block)':
        'block_size 大于 L_kv（只有一个分块）',
    'book Eq. {label}, {chapter}':
        '书中公式 {label}，{chapter}',
    'both coordinates of pair i turn by m theta_i. Rotate-half: angles = np.concatenate([m theta, m theta], -1) (coordinates i and i + d/2 share theta_i); interleaved: np.repeat(m theta, 2, axis=-1) (coordinates 2i and 2i+1 share theta_i).':
        '第 i 对的两个坐标都转过 m theta_i。rotate-half 形式：angles = np.concatenate([m theta, m theta], -1)（坐标 i 和 i + d/2 共用 theta_i）；interleaved 形式：np.repeat(m theta, 2, axis=-1)（坐标 2i 和 2i+1 共用 theta_i）。',
    "both the split into heads and the merge reshape without transposing: each 'head' mixes positions and column blocks":
        '拆分成头和合并各头时都只做了 reshape 而没有转置：每个“头”都混杂了不同的位置和不同的列块',
    'broadcast over heads and queries':
        '在头和查询上广播',
    "cache the n_kv_heads heads and repeat only the copies you attend with: GQA's point is the smaller cache (part II 'MQA and GQA').":
        '缓存只存 n_kv_heads 个头，重复出的副本只用于做注意力：GQA 的意义就在于更小的缓存（第二部分“MQA 与 GQA”）。',
    'causal mask':
        '因果掩码',
    'compared with causal attention over all {0} positions':
        '与在全部 {0} 个位置上做的因果注意力比较',
    "compared with the layer's attention over all {0} positions":
        '与该层在全部 {0} 个位置上的注意力比较',
    'cross-attention':
        '交叉注意力',
    'dQ and dK miss the factor `scale`: dQ = dS K instead of scale * dS K (and the same for dK)':
        'dQ 和 dK 漏掉了因子 `scale`：dQ = dS K，而不是 scale * dS K（dK 也一样）',
    'dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)).':
        'dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))。',
    'dS = A * (dA - rowsum(dA * A)), from J = diag(a) - a a^T.':
        'dS = A * (dA - rowsum(dA * A))，由 J = diag(a) - a a^T 得出。',
    'dV = A dO instead of A^T dO':
        'dV 算成了 A dO，而不是 A^T dO',
    'd_k = q.shape[-1]; v.shape[-1] is d_v, which may differ (this case has d_v != d_k).':
        'd_k = q.shape[-1]；v.shape[-1] 是 d_v，它可能与 d_k 不同（本用例中 d_v != d_k）。',
    'd_k is the last axis: q.shape[-1]. Axis -2 is the sequence.':
        'd_k 是最后一个轴：q.shape[-1]。轴 -2 是序列轴。',
    "drop the sink's column after the softmax (probs[..., :-1] if you appended it last, probs[..., 1:] if first) and use the remaining L_kv columns for out = weights @ v.":
        '在 softmax 之后去掉汇聚点的那一列（如果你把它追加在最后，用 probs[..., :-1]；如果放在最前，用 probs[..., 1:]），再用剩下的 L_kv 列计算 out = weights @ v。',
    'dtype=bool: np.tril(np.ones((l_q, l_kv), dtype=bool), ...). A 0/1 number mask in np.where or as an index does something else.':
        'dtype=bool：np.tril(np.ones((l_q, l_kv), dtype=bool), ...)。由 0/1 数值构成的掩码放进 np.where 或用作索引时，做的是另一回事。',
    'e / e.sum(axis=axis, keepdims=True): keepdims keeps the reduced axis in place for broadcasting.':
        'e / e.sum(axis=axis, keepdims=True)：keepdims 把被归约的轴留在原位，以便广播。',
    'each call given the caches the previous one returned':
        '每次调用都传入上一次调用返回的缓存',
    "each head's query and key have d_n + d_r coordinates (q_nope and q_rope side by side), so the scale is 1 / sqrt(q_nope.shape[-1] + q_rope.shape[-1]), the same as the naive layer's.":
        '每个头的查询和键都有 d_n + d_r 个坐标（q_nope 与 q_rope 并排拼接），所以缩放因子是 1 / sqrt(q_nope.shape[-1] + q_rope.shape[-1])，与朴素形式的层相同。',
    "each pair turns by -m theta_i instead of +m theta_i: the sine terms have the wrong sign (for example rotate_half(x) = (x2, -x1) instead of (-x2, x1)). That is the inverse rotation, RoPE's backward pass":
        '每对坐标转过 -m theta_i，而不是 +m theta_i：正弦项的符号反了（例如 rotate_half(x) = (x2, -x1)，而不是 (-x2, x1)）。这是逆旋转，即 RoPE 的反向传播',
    'each query sees itself only':
        '每个查询只能看到它自己',
    "each value v_j is multiplied by the gate of its own key position, sigmoid(x_kv[j] W_gate + b_gate), before the weighted sum, instead of each query's output row by the gate of that query":
        '在加权求和之前，每个值 v_j 都乘以了它自己的键位置的门控 sigmoid(x_kv[j] W_gate + b_gate)，而不是把每个查询的输出行乘以该查询的门控',
    'elementwise':
        '逐元素',
    'elementwise gate':
        '逐元素门控',
    'eps is added after the square root, x / (sqrt(mean(x^2)) + eps), instead of under it':
        'eps 加在了平方根外面，x / (sqrt(mean(x^2)) + eps)，而不是加在平方根里面',
    'every entry near +{0}':
        '每一项都接近 +{0}',
    "exp of a number above about 709 overflows float64: shift every term of a row, the sink's included, by the largest of them.":
        '对大于约 709 的数取 exp 会使 float64 上溢：把一行中的每一项（包括汇聚点那一项）都减去其中最大的那一项。',
    'exp of a score above about 709 overflows float64: subtract the row maximum first.':
        '分数大于约 709 时，exp 会超出 float64 的范围而上溢：先减去行最大值。',
    'exp of a score above about 709 overflows float64: the running maximum is what prevents it.':
        '分数大于约 709 时，exp 会超出 float64 的范围而上溢：防止上溢的正是运行最大值。',
    'exp(-1000) underflows to 0 in float64, so row 1 needs its own shift.':
        '在 float64 下 exp(-1000) 会下溢为 0，所以第 1 行需要按它自己的最大值平移。',
    'exp(1000) overflows float64 (the limit is about exp(709)).':
        'exp(1000) 在 float64 下会上溢（上限约为 exp(709)）。',
    'exp(S_ij) / (sum_j exp(S_ij) + exp(sink_h)) over the allowed keys (rows sum to 1 - p_sink)':
        '在允许的键上计算的 exp(S_ij) / (sum_j exp(S_ij) + exp(sink_h))（各行之和为 1 - p_sink）',
    'exp(x_i - max x) / sum_j exp(x_j - max x) along axis':
        'exp(x_i - max x) / sum_j exp(x_j - max x)，沿 axis 计算',
    'explicit scale':
        '显式指定 scale',
    'far into the sequence':
        '位于序列中很靠后的位置',
    'finish with * weight: one gain per coordinate, shared by every head.':
        '最后还要 * weight：每个坐标一个增益，由所有头共用。',
    'finish with concat @ W_o (+ b_o): the heads are mixed by W^O (Eq. multihead-output).':
        '最后计算 concat @ W_o (+ b_o)：各个头由 W^O 混合在一起（公式 multihead-output）。',
    'for start in range(0, L_kv, block_size): k[..., start:start + block_size, :]; the last block is shorter (T = ceil(n / b) blocks).':
        'for start in range(0, L_kv, block_size): k[..., start:start + block_size, :]；最后一个分块更短（共 T = ceil(n / b) 个分块）。',
    'four narrow heads':
        '四个窄头',
    'from empty caches (N, g, {0}, head_dim)':
        '从空缓存 (N, g, {0}, head_dim) 开始',
    'from empty caches (N, {0}, d_c) and (N, {1}, d_r)':
        '从空缓存 (N, {0}, d_c) 和 (N, {1}, d_r) 开始',
    'gate first, then merge and project: Z = heads * G (N, h, L_q, head_dim), out = merge(Z) @ W_o + b_o. W^O mixes the coordinates of all heads, so a gate after it is another function (Eq. gate-layer).':
        '先门控，再合并和投影：Z = heads * G (N, h, L_q, head_dim)，out = merge(Z) @ W_o + b_o。W^O 会混合所有头的坐标，所以放在它之后的门控算的是另一个函数（公式 gate-layer）。',
    'gates shut and fully open (logits in the thousands)':
        '门控完全关闭和完全打开（logits 达到数千量级）',
    'groups of {0}':
        '每组 {0} 个头',
    'guard the empty rows: shift by a finite number where the row maximum is -inf, and divide only where the row sum is > 0 (np.divide(e, total, out=np.zeros_like(e), where=total > 0)), or zero those rows afterwards.':
        '处理好空行：在行最大值为 -inf 的地方改用一个有限的数做平移，并且只在行和 > 0 的地方做除法（np.divide(e, total, out=np.zeros_like(e), where=total > 0)），或者事后把这些行置零。',
    'headwise':
        '逐头',
    'headwise gate':
        '逐头门控',
    'j <= L_kv - L_q + i includes equality: np.tril(..., k=l_kv - l_q), not k=l_kv - l_q - 1.':
        'j <= L_kv - L_q + i 包含等号：应为 np.tril(..., k=l_kv - l_q)，而不是 k=l_kv - l_q - 1。',
    'keep every L_q x L_kv quantity tile by tile: the row log-sum-exp by the online recurrence over key tiles (a running maximum and sum), the output and the gradients from P = exp(S_tile - LSE) recomputed per tile, and a mask only as a view (np.broadcast_to) sliced per tile.':
        '每个 L_q x L_kv 的量都要逐块处理：每行的指数和的对数（LSE）用在键分块上的在线递推（一个运行最大值和一个运行和）求出，输出和梯度由每个分块重新计算的 P = exp(S_tile - LSE) 求出，掩码只以视图（np.broadcast_to）的形式存在，并按分块切片。',
    'l = alpha * l + P.sum(axis=-1, keepdims=True).':
        '应为 l = alpha * l + P.sum(axis=-1, keepdims=True)。',
    'large activations (scores in the hundreds)':
        '很大的激活值（分数达到数百）',
    'large logits':
        '很大的 logits',
    'large logits (scaled scores in the thousands)':
        '很大的 logits（缩放后的分数达数千）',
    'large logits (scores in the thousands)':
        '很大的 logits（分数达到数千）',
    'large logits and sinks (in the thousands)':
        '很大的 logits 和汇聚点 logit（达数千）',
    "leave the weights alone and gate the outputs A_i V_i; return the softmax's weights, ungated.":
        '不要改动权重，而是对输出 A_i V_i 做门控；返回 softmax 的权重，不经门控。',
    'mask ({0}, {1})':
        'mask ({0}, {1})',
    'mask ({0}, {1}, {2}, {3})':
        'mask ({0}, {1}, {2}, {3})',
    'mask the scores before the softmax (-inf where not allowed), so the softmax normalises over the allowed keys only.':
        '在 softmax 之前对分数做掩码（不可关注处设为 -inf），这样 softmax 只在可关注的键上归一化。',
    'mask[i, j] = (j <= l_kv - l_q + i), booleans':
        'mask[i, j] = (j <= l_kv - l_q + i)，布尔值',
    'mask[i, j] = (p - window < j <= p) with p = l_kv - l_q + i, booleans':
        'mask[i, j] = (p - window < j <= p)，其中 p = l_kv - l_q + i，布尔值',
    'mask[i, j] = True means query i may attend to key j.':
        'mask[i, j] = True 表示查询 i 可以关注键 j。',
    'masked entries (weight {0}) and row {1} fully masked':
        '被掩蔽的项（权重为 {0}），且第 {1} 行被完全掩蔽',
    'masked scores are set to 0 (for example scores * mask) instead of -inf, so masked keys still get weight':
        '被掩蔽的分数被设成了 0（例如 scores * mask）而不是 -inf，因此被掩蔽的键仍然得到了权重',
    'masked scores are set to a large negative number (like -1e9) instead of -inf, so a query row with no allowed key gets uniform weights over all its keys (and the average of all the values) instead of zero weights and a zero output':
        '被掩蔽的分数被设为一个很大的负数（如 -1e9），而不是 -inf，于是没有可关注键的查询行会在它的所有键上得到均匀的权重（输出所有值的平均），而不是零权重和零输出',
    "mean(x**2), not x.var(): RMSNorm's statistic is taken around 0, not around the mean.":
        '用 mean(x**2)，而不是 x.var()：RMSNorm 的统计量是围绕 0 计算的，而不是围绕均值。',
    'merge the two axes: .reshape(N, g * n_rep, L, d), group-major, so that query head j reads kv head j // n_rep.':
        '合并这两个轴：.reshape(N, g * n_rep, L, d)，组在外层，这样查询头 j 读取的是键/值头 j // n_rep。',
    "multiply the scores by `scale`, and when scale is None use 1 / sqrt(d_k) with d_k = q.shape[-1]. Why: the variance of q . k grows like d_k (part I 'Why divide by √dₖ').":
        '把分数乘以 `scale`；当 scale 为 None 时，使用 1 / sqrt(d_k)，其中 d_k = q.shape[-1]。原因：q . k 的方差与 d_k 成正比地增长（第一部分“为什么要除以 √dₖ”）。',
    'n_rep = {0} (MHA)':
        'n_rep = {0}（MHA）',
    'neither the running sum l nor the accumulator is rescaled when the running maximum grows':
        '运行最大值增大时，运行和 l 和累加器都没有重新缩放',
    'no batch axes':
        '无批量轴',
    'no biases':
        '无偏置',
    'non-contiguous (a transposed view)':
        '非连续存储（一个转置视图）',
    'non-contiguous inputs (transposed views)':
        '非连续存储的输入（转置视图）',
    'non-contiguous q':
        '非连续存储的 q',
    'non-contiguous x (a transposed view)':
        '非连续存储的 x（一个转置视图）',
    'non-contiguous x_q':
        '非连续存储的 x_q',
    'non-contiguous y (a transposed view)':
        '非连续存储的 y（转置视图）',
    'none of the biases b_q, b_k, b_v, b_o is added':
        '偏置 b_q、b_k、b_v、b_o 一个都没有加上',
    'np.concatenate([k_cache, k_new], axis=2): the cache keeps positions in order, oldest first.':
        'np.concatenate([k_cache, k_new], axis=2)：缓存按顺序保存各个位置，最早的在前。',
    'np.mean(x**2, axis=-1, keepdims=True) keeps the reduced axis in place for broadcasting.':
        'np.mean(x**2, axis=-1, keepdims=True) 把被归约的轴留在原位，以便广播。',
    'np.mean(x**2, axis=-1, keepdims=True): the root *mean* square, so y has RMS 1 before the gain.':
        'np.mean(x**2, axis=-1, keepdims=True)：均方根取的是平方的*均值*，这样 y 在乘以增益之前的 RMS 为 1。',
    "np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q). Beware: torch's is_causal=True is top-left when L_q != L_kv.":
        'np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q)。注意：当 L_q != L_kv 时，torch 的 is_causal=True 是左上对齐的。',
    'one decoding step':
        '一个解码步',
    'one head':
        '一个头',
    'one key/value head':
        '只有一个键/值头',
    'one key/value head (MQA)':
        '只有一个键/值头（MQA）',
    'one logit per head: sinks[:, None, None] against (N, h, L_q, L_kv) scores, a column of shape (N, h, L_q, 1) whose entries in head j all equal sinks[j].':
        '每个头一个 logit：sinks[:, None, None] 与形状为 (N, h, L_q, L_kv) 的分数相配，得到形状为 (N, h, L_q, 1) 的一列，头 j 中的各项都等于 sinks[j]。',
    'one new query after {0} cached positions':
        '已缓存 {0} 个位置之后的一个新查询',
    'one pair (d = {0})':
        '一对坐标（d = {0}）',
    'one position':
        '只有一个位置',
    'one query':
        '一个查询',
    'one weight for every head':
        '所有头共用同一个 weight',
    'one {kind}':
        '一个 {kind}',
    "only the window's lower bound is applied (j > p - window): the queries also see every future key":
        '只施加了窗口的下界（j > p - window）：查询还能看到所有未来的键',
    'out = acc / l after the last block (Eq. online-final).':
        '处理完最后一个分块后，out = acc / l（公式 online-final）。',
    "out = concat @ W_o + b_o when params has 'b_o'.":
        "当 params 含有 'b_o' 时，out = concat @ W_o + b_o。",
    "out is every step's output, concatenated along the position axis. The single steps above passed, so look at what you return: c_cache must hold every latent so far, oldest first, and k_rope_cache every rotary key, each rotated once at its own position.":
        'out 是每一步的输出沿位置轴拼接而成的。上面的单步用例都已通过，所以请检查你返回的内容：c_cache 必须按从旧到新的顺序保存迄今为止的每一个潜在向量，k_rope_cache 必须保存每一个旋转键，每个都只在它自己的位置上旋转一次。',
    "out is every step's output, concatenated along the position axis. The single steps above passed, so look at what you return: the caches must hold every position so far, oldest first, n_kv_heads heads.":
        'out 是每一步的输出沿位置轴拼接而成的。上面的单步用例都已通过，所以请检查你返回的内容：缓存必须按从旧到新的顺序保存迄今为止的每一个位置，共 n_kv_heads 个头。',
    "out is every step's output, concatenated along the position axis. The single steps above passed, so look at what you return: the key cache must hold every key so far, each rotated once at its own position, oldest first; the value cache the values as they came.":
        'out 是每一步的输出沿位置轴拼接而成的。上面的单步用例都已通过，所以请检查你返回的内容：键缓存必须按从旧到新的顺序保存迄今为止的每一个键，每个键都只在它自己的位置上旋转一次；值缓存则按原样保存传入的值。',
    'out of order':
        '乱序',
    'out[:, j] = y[:, j // n_rep] (np.repeat(y, n_rep, axis=1))':
        'out[:, j] = y[:, j // n_rep]（np.repeat(y, n_rep, axis=1)）',
    "p - window < j <= p: `window` keys, the query's own included; window = 1 is attention to oneself.":
        'p - window < j <= p：共 `window` 个键，包括查询自己位置上的键；window = 1 就是只关注自己。',
    'padding mask (lengths {0} and {1})':
        '填充掩码（长度为 {0} 和 {1}）',
    'pair i of the vector at position m turned by m theta_i, theta_i = base^(-2i/d) (pairs (x[2i], x[2i+1]))':
        '位置 m 处向量的第 i 对坐标转过 m theta_i，theta_i = base^(-2i/d)（坐标对为 (x[2i], x[2i+1])）',
    'pair i of the vector at position m turned by m theta_i, theta_i = base^(-2i/d) (pairs (x[i], x[i + d/2]))':
        '位置 m 上向量的第 i 对坐标转过 m theta_i，theta_i = base^(-2i/d)（配对为 (x[i], x[i + d/2])）',
    'params may hold biases: add b_q, b_k, b_v to the projections and b_o to the output when they are present.':
        'params 中可能有偏置：如果有，就把 b_q、b_k、b_v 加到各自的投影上，把 b_o 加到输出上。',
    "part I 'From one head to h heads'":
        '第一部分“从一个头到 h 个头”',
    "part I 'Scaled dot-product attention'":
        '第一部分“缩放点积注意力”',
    "part I 'Why divide by √dₖ'":
        '第一部分“为什么要除以 √dₖ”',
    "part II 'Autoregressive decoding and the KV cache'":
        '第二部分“自回归解码与键值缓存”',
    "part II 'Exact attention without the L × L matrix'":
        '第二部分“不构造 L × L 矩阵的精确注意力”',
    "part II 'From the recurrence to a kernel'":
        '第二部分“从递推到核函数”',
    "part II 'MQA and GQA'":
        '第二部分“MQA 与 GQA”',
    "part II 'The backward pass'":
        '第二部分“反向传播”',
    "part IV 'Gated attention'":
        '第四部分“门控注意力”',
    "part IV 'Multi-head latent attention (MLA)'":
        '第四部分“多头潜在注意力（MLA）”',
    "part IV 'QK-norm and logit soft-capping'":
        '第四部分“QK 归一化与 logit 软上限”',
    "part IV 'Rotary position embeddings (RoPE)'":
        '第四部分“旋转位置编码（RoPE）”',
    "part IV 'Sliding windows and attention sinks'":
        '第四部分“滑动窗口与注意力汇聚点”',
    'per head (QK-norm)':
        '逐头（QK 归一化）',
    "positions = P + np.arange(T) with P = c_cache.shape[1]: a token's position counts the cached ones.":
        'positions = P + np.arange(T)，其中 P = c_cache.shape[1]：词元的位置要把缓存中的位置也算进去。',
    "positions = c + np.arange(T) with c = k_cache.shape[2]: a token's position is its index in the whole sequence, cache included.":
        'positions = c + np.arange(T)，其中 c = k_cache.shape[2]：词元的位置是它在整个序列（包括缓存部分）中的下标。',
    'positions [{0}, {1}, {2}, {3}, {4}]':
        'positions [{0}, {1}, {2}, {3}, {4}]',
    'positions [{0}, {1}, {2}, {3}]':
        'positions [{0}, {1}, {2}, {3}]',
    'positions [{0}, {1}, {2}]':
        'positions [{0}, {1}, {2}]',
    'positions [{0}]':
        'positions [{0}]',
    'positions after {0} cached tokens':
        '已缓存 {0} 个词元之后的位置',
    'positions of shape ({0}, {1}, {2}) ({3} .. {4})':
        'positions 的形状为 ({0}, {1}, {2})（取值 {3} .. {4}）',
    'positions per sequence (N, {0}, L)':
        '每个序列各自的位置 (N, {0}, L)',
    'positions with gaps':
        '位置有间隔',
    'positions[..., None] * theta broadcasts (N, 1, L, 1) against the d/2 frequencies, then against x (N, h, L, d/2 per half).':
        'positions[..., None] * theta 先把 (N, 1, L, 1) 与 d/2 个频率做广播，再与 x (N, h, L, 每一半 d/2) 做广播。',
    'prefill into empty caches':
        '向空缓存预填充',
    'q and k rotated at {0} .. {1}':
        'q 和 k 在位置 {0} .. {1} 上旋转',
    'query i is position L_kv - L_q + i: it sees keys j <= L_kv - L_q + i, itself included and nothing after, np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q) (torch: .tril(diagonal=l_kv - l_q)).':
        '查询 i 位于位置 L_kv - L_q + i：它看到键 j <= L_kv - L_q + i，包括它自己，之后的一概看不到，即 np.tril(np.ones((l_q, l_kv), dtype=bool), k=l_kv - l_q)（torch：.tril(diagonal=l_kv - l_q)）。',
    'query i sits at position p = l_kv - l_q + i and sees the keys p - window < j <= p: `window` keys, itself included (gpt-oss, Hugging Face). In NumPy: np.tril(ones, k=l_kv - l_q) & ~np.tril(ones, k=l_kv - l_q - window).':
        '查询 i 位于位置 p = l_kv - l_q + i，能看到满足 p - window < j <= p 的键：共 `window` 个键，包括它自己（gpt-oss、Hugging Face 的约定）。用 NumPy 写：np.tril(ones, k=l_kv - l_q) & ~np.tril(ones, k=l_kv - l_q - window)。',
    'query row {0} has no allowed key':
        '第 {0} 个查询行没有可关注的键',
    'query rows with no allowed key':
        '没有可关注键的查询行',
    'query {0} no key at all':
        '查询 {0} 没有任何可关注的键',
    "query {0}'s first key block and query {1}'s first two blocks fully masked":
        '查询 {0} 的第一个键分块和查询 {1} 的前两个分块被完全掩蔽',
    'repeat along axis 1, the head axis: np.repeat(y, n_rep, axis=1).':
        '沿轴 1（即头轴）重复：np.repeat(y, n_rep, axis=1)。',
    'repeat each key/value head h/g times in place: np.repeat(k, n_rep, axis=1) or k.repeat_interleave(n_rep, dim=1), not np.tile or k.repeat(1, n_rep, 1, 1). Consecutive query heads form a group (Eq. gqa-map).':
        '把每个键/值头重复 h/g 次，副本紧挨着原来的头：np.repeat(k, n_rep, axis=1) 或 k.repeat_interleave(n_rep, dim=1)，而不是 np.tile 或 k.repeat(1, n_rep, 1, 1)。相邻的查询头组成一组（公式 gqa-map）。',
    "reshape to (N, L, h, head_dim) first (each position's row cut into h column blocks), then swap axes 1 and 2 (Theorem multihead-thm-fused).":
        '先 reshape 成 (N, L, h, head_dim)（每个位置的行被切成 h 个列块），再交换轴 1 和轴 2（定理 multihead-thm-fused）。',
    'reshape to (N, L, h, head_dim): the heads are the contiguous column blocks of W^Q (Eq. multihead-blocks).':
        '重塑为 (N, L, h, head_dim)：各个头就是 W^Q 中相邻的列块（公式 multihead-blocks）。',
    'return booleans, True = may attend; the additive form is an implementation detail of the softmax.':
        '返回布尔值，True = 可以关注；加性形式只是 softmax 的实现细节。',
    'return k_all = concat([k_cache, k_new], axis=2) (and the same for v): the next step needs them.':
        '返回 k_all = concat([k_cache, k_new], axis=2)（v 也一样）：下一步需要用到它们。',
    'return np.concatenate([c_cache, c_new], axis=1) and the same for the rotated k_rope: the next step reads them.':
        '返回 np.concatenate([c_cache, c_new], axis=1)，旋转后的 k_rope 也一样：下一步要读取它们。',
    'return the latents themselves, c_cache (N, P + T, d_c), and the rotated shared keys, k_rope_cache (N, P + T, d_r), P = c_cache.shape[1] being the cached positions: concatenate along axis 1. Every head reads the same cached rows; W_uk_i and W_uv_i are applied to the query and to the weighted sum, never to the cache (Eq. mla-cache).':
        '返回潜在向量本身 c_cache (N, P + T, d_c)，以及已旋转的共享键 k_rope_cache (N, P + T, d_r)，其中 P = c_cache.shape[1] 是已缓存的位置数：沿轴 1 拼接。每个头读取的都是同样的缓存行；W_uk_i 和 W_uv_i 作用在查询和加权和上，从不作用在缓存上（公式 mla-cache）。',
    'return the weights of every head.':
        '返回每个头的权重。',
    'return them in the order of the signature: out, weights (attention, multi-head attention); out, k_cache, v_cache (a decode step); dq, dk, dv (the gradient).':
        '按函数签名中的顺序返回：out, weights（注意力、多头注意力）；out, k_cache, v_cache（解码步）；dq, dk, dv（梯度）。',
    'right: {names}':
        '正确：{names}',
    'rotate k_new at its positions c + i before you attend and before you append it to the cache.':
        '在做注意力之前、也在把 k_new 追加到缓存之前，先在它的位置 c + i 上旋转它。',
    'rotate k_new once, at its own positions, before appending it: the cache stores rotated keys R_n k_n, each turned at the position it was computed at and never again (Eq. rope-cache).':
        '在追加 k_new 之前，在它自己的位置上把它旋转一次：缓存存放的是旋转后的键 R_n k_n，每个键都在计算它时所在的位置上旋转，此后不再旋转（公式 rope-cache）。',
    'rotate q and k only. The position enters through the scores, <R_m q, R_n k> = <q, R_(n-m) k> (Eq. rope-relative); the values the weights average carry no position.':
        '只旋转 q 和 k。位置通过分数进入，<R_m q, R_n k> = <q, R_(n-m) k>（公式 rope-relative）；权重所平均的值不携带位置。',
    'rotate q_rope and k_rope only. The score of head i is (q_nope_i W_uk_i^T) c^T + (R q_rope_i)(R k_rope)^T: the first term has no rotation at all (that is what lets W_uk_i be absorbed, Proposition mla-prop-rope), the second carries the positions.':
        '只旋转 q_rope 和 k_rope。头 i 的分数是 (q_nope_i W_uk_i^T) c^T + (R q_rope_i)(R k_rope)^T：第一项完全不含旋转（正因如此 W_uk_i 才能被吸收，见命题 mla-prop-rope），第二项携带位置信息。',
    'rotate the new queries at their positions c + i as well: the relative form <R_m q, R_n k> = <q, R_(n-m) k> needs both rotations.':
        '新查询也要在它们的位置 c + i 上旋转：相对形式 <R_m q, R_n k> = <q, R_(n-m) k> 需要两边都旋转。',
    'row {0} is all zeros':
        '第 {0} 行全为零',
    'row {0} near -{1}':
        '第 {0} 行的各项接近 -{1}',
    'row {0} near {1}':
        '第 {0} 行的各项接近 {1}',
    'rows':
        '多行',
    'rows are queries, columns are keys: shape (l_q, l_kv), mask[i, j] = (j <= l_kv - l_q + i).':
        '行是查询，列是键：形状为 (l_q, l_kv)，mask[i, j] = (j <= l_kv - l_q + i)。',
    'saturated one-hot rows':
        '饱和的独热行',
    'scale * dS K':
        'scale * dS K',
    'scale * dS^T Q':
        'scale * dS^T Q',
    'scale = 1 / math.sqrt(d_k) (or d_k ** -0.5): it brings the variance d_k of q . k back to 1 (Eq. scaling-var-scaled).':
        'scale = 1 / math.sqrt(d_k)（或 d_k ** -0.5）：它把 q . k 的方差 d_k 拉回到 1（公式 scaling-var-scaled）。',
    'scale = 1 / math.sqrt(d_k) if scale is None else scale.':
        '写成 scale = 1 / math.sqrt(d_k) if scale is None else scale。',
    "scale by 1 / sqrt(head_dim), head_dim = W_q.shape[1] // n_heads (= q.shape[-1] after the split into heads). The dot product inside one head sums head_dim terms, so its variance is head_dim (Eq. scaling-var-scaled); d_model = n_heads * head_dim is the width of the whole layer. (This bug shipped in a widely watched lecture's code, C ** -0.5 with C the embedding width, and was fixed after a reader's pull request.)":
        '用 1 / sqrt(head_dim) 缩放，head_dim = W_q.shape[1] // n_heads（拆分成头之后即 q.shape[-1]）。一个头内部的点积是 head_dim 项之和，所以它的方差是 head_dim（公式 scaling-var-scaled）；d_model = n_heads * head_dim 是整个层的宽度。（这个错误曾出现在一门广为观看的课程的代码中，写作 C ** -0.5，其中 C 是嵌入维度，直到一位读者提交了拉取请求才得到修正。）',
    'scale q k^T only, then append the sink logit as it is.':
        '只缩放 q k^T，然后把汇聚点 logit 原样追加上去。',
    'scores * d_k ** -0.5, or scores / d_k ** 0.5.':
        'scores * d_k ** -0.5，或者 scores / d_k ** 0.5。',
    'self-attention (square)':
        '自注意力（方阵）',
    'self-attention (x_kv is x_q)':
        '自注意力（x_kv 就是 x_q）',
    'several pairs':
        '多对坐标',
    'shift by a finite number while the running maximum is still -inf: shift = np.where(np.isfinite(m_new), m_new, 0.0); every term is exp(-inf) = 0 anyway.':
        '当运行最大值仍为 -inf 时，用一个有限的数做平移：shift = np.where(np.isfinite(m_new), m_new, 0.0)；反正每一项都是 exp(-inf) = 0。',
    'shift every term of the row by the same number, the maximum over the scores and the sink: m = max(max_j S_j, sink), Z = sum_j exp(S_j - m) + exp(sink - m).':
        '把这一行的每一项都减去同一个数，即分数和汇聚点中的最大值：m = max(max_j S_j, sink)，Z = sum_j exp(S_j - m) + exp(sink - m)。',
    'sigmoid(-3000) is 0 and sigmoid(3000) is 1: 1 / (1 + exp(-a)) gets there (exp overflows to inf, 1 / inf = 0), exp(a) / (1 + exp(a)) gives inf / inf = NaN.':
        'sigmoid(-3000) 为 0，sigmoid(3000) 为 1：1 / (1 + exp(-a)) 能得到这个结果（exp 上溢为 inf，1 / inf = 0），而 exp(a) / (1 + exp(a)) 给出 inf / inf = NaN。',
    'sinks ({0},)':
        'sinks ({0},)',
    'sinks far above the scores (most weight on the sink)':
        '汇聚点 logit 远大于分数（大部分权重落在汇聚点上）',
    'small activations (RMS near sqrt(eps))':
        '小激活值（RMS 接近 sqrt(eps)）',
    'softmax(QK^T/sqrt(d_k)) (masked entries 0, rows with no allowed key all 0)':
        'softmax(QK^T/sqrt(d_k))（被掩蔽的项为 0，没有可关注键的行全为 0）',
    'softmax(QK^T/sqrt(d_k)) V':
        'softmax(QK^T/sqrt(d_k)) V',
    'softmax(QK^T/sqrt(d_k)) V computed in one piece, i.e. acc / l after the last block':
        '一次性算出的 softmax(QK^T/sqrt(d_k)) V，即最后一个分块之后的 acc / l',
    'softmax(Q_i K_i^T / sqrt(head_dim)) for every head i':
        '每个头 i 的 softmax(Q_i K_i^T / sqrt(head_dim))',
    'softmax(Q_i K_i^T / sqrt(head_dim)) for every head i, not gated':
        '每个头 i 的 softmax(Q_i K_i^T / sqrt(head_dim))，不经门控',
    'softmax(R q [K_cache; R k_new]^T / sqrt(head_dim), causal bottom-right) [V_cache; v_new], R = RoPE at the new positions c .. c+T-1':
        'softmax(R q [K_cache; R k_new]^T / sqrt(head_dim), 右下对齐的因果掩码) [V_cache; v_new]，R 为新位置 c .. c+T-1 上的 RoPE',
    'softmax([q_nope_i W_uk_i^T, R q_rope_i] [C; K_rope]^T / sqrt(d_n + d_r), causal bottom-right) C W_uv_i, head by head, over the cached and the new rows':
        'softmax([q_nope_i W_uk_i^T, R q_rope_i] [C; K_rope]^T / sqrt(d_n + d_r), 右下角对齐的因果掩码) C W_uv_i，逐头计算，覆盖已缓存的行和新行',
    'softmax(q [K_cache; k_new]^T / sqrt(head_dim), causal bottom-right) [V_cache; v_new]':
        'softmax(q [K_cache; k_new]^T / sqrt(head_dim), 右下对齐的因果掩码) [V_cache; v_new]',
    'softmax(scores, axis=-1): each query gets its own distribution over the keys.':
        'softmax(scores, axis=-1)：每个查询在键上得到它自己的分布。',
    'split the gate like the queries: G.reshape(N, L_q, h, -1).transpose(0, 2, 1, 3), which is (N, h, L_q, 1) headwise and (N, h, L_q, head_dim) elementwise.':
        '像拆分查询那样拆分门控：G.reshape(N, L_q, h, -1).transpose(0, 2, 1, 3)，逐头时得到 (N, h, L_q, 1)，逐元素时得到 (N, h, L_q, head_dim)。',
    'split: reshape to (N, L, h, head_dim), then swap axes 1 and 2; merge: swap them back, then reshape (Theorem multihead-thm-fused).':
        '拆分：先 reshape 成 (N, L, h, head_dim)，再交换轴 1 和轴 2；合并：先把这两个轴换回来，再 reshape（定理 multihead-thm-fused）。',
    'square (L_q = L_kv)':
        '方阵（L_q = L_kv）',
    'steps of {0}':
        '各步依次 {0}',
    "style 'half' (Hugging Face's Llama, Qwen, Gemma, Mistral) pairs x[i] with x[i + d/2]: a, b = x[..., :d//2], x[..., d//2:]; style 'interleaved' (Meta's original Llama, GPT-J) pairs x[2i] with x[2i+1]: a, b = x[..., 0::2], x[..., 1::2]. The checkers take style= to say which one your function implements.":
        "style 'half'（Hugging Face 的 Llama、Qwen、Gemma、Mistral）把 x[i] 与 x[i + d/2] 配对：a, b = x[..., :d//2], x[..., d//2:]；style 'interleaved'（Meta 最初的 Llama、GPT-J）把 x[2i] 与 x[2i+1] 配对：a, b = x[..., 0::2], x[..., 1::2]。检验函数通过 style= 参数来指明你的函数实现的是哪一种。",
    'subtract the row maximum before exp: e = exp(x - x.max(axis, keepdims=True)). By the shift lemma (sdpa-lem-shift) this changes nothing mathematically, and every exponent becomes <= 0.':
        '在取 exp 之前减去行最大值：e = exp(x - x.max(axis, keepdims=True))。由平移不变引理（sdpa-lem-shift），这在数学上不改变任何结果，而且每个指数都变为 <= 0。',
    'swap axes 1 and 2 back to (N, L, h, head_dim) first, then reshape to (N, L, h*head_dim).':
        '先把轴 1 和轴 2 交换回来，得到 (N, L, h, head_dim)，再重塑为 (N, L, h*head_dim)。',
    'take the maximum along the softmax axis, with keepdims: x.max(axis=axis, keepdims=True).':
        '沿 softmax 的轴取最大值，并保留被归约的轴（keepdims）：x.max(axis=axis, keepdims=True)。',
    'the `base` argument is ignored: the frequencies always use base 10000':
        '忽略了参数 `base`：频率始终使用 base 10000',
    'the `eps` argument is ignored (a fixed eps, or none at all)':
        '参数 `eps` 被忽略了（用了固定的 eps，或者根本没有 eps）',
    'the `mask` argument is ignored: every query attends to every key, allowed or not':
        '忽略了 `mask` 参数：每个查询都关注每个键，不管是否允许',
    'the `positions` argument is ignored: the vectors are rotated at positions 0, 1, ..., L - 1 (np.arange(L)) whatever positions were passed':
        '忽略了参数 `positions`：无论传入什么位置，向量都在位置 0, 1, ..., L - 1（np.arange(L)）上旋转',
    'the `scale` argument is ignored: the scores are always multiplied by 1 / sqrt(d_k)':
        '忽略了 `scale` 参数：分数总是乘以 1 / sqrt(d_k)',
    'the accumulator is not rescaled by alpha = exp(m_old - m_new) when the running maximum grows':
        '运行最大值增大时，累加器没有乘以 alpha = exp(m_old - m_new) 重新缩放',
    "the book's convention is True = may attend: np.where(mask, scores, -np.inf) (torch: scores.masked_fill(~mask, float('-inf'))).":
        "本书的约定是 True 表示可以关注：np.where(mask, scores, -np.inf)（torch：scores.masked_fill(~mask, float('-inf'))）。",
    'the causal mask is aligned top-left (query i sees keys 0..i) instead of bottom-right (query i sees keys 0..L_kv - L_q + i): with a KV cache the L_q queries are the last positions of the L_kv keys':
        '因果掩码按左上角对齐（查询 i 看到键 0..i），而不是按右下角对齐（查询 i 看到键 0..L_kv - L_q + i）：有键值缓存时，L_q 个查询是 L_kv 个键中的最后几个位置',
    'the causal mask is off by one: each query also sees the key just after its own position (np.tril(..., k=l_kv - l_q + 1), or j <= i + 1)':
        '因果掩码差了一位：每个查询还能看到紧跟在自己位置之后的那个键（np.tril(..., k=l_kv - l_q + 1)，或 j <= i + 1）',
    'the concatenated heads are returned without the output projection W^O (and b^O)':
        '返回的是拼接后的各头，没有经过输出投影 W^O（以及 b^O）',
    "the coordinates are paired the other convention's way: (x[2i], x[2i+1]) where rotate-half pairs (x[i], x[i + d/2]), or the reverse. Each convention is right for the checkpoints trained with it, and the two are not interchangeable (they differ by a permutation of the columns of W_q and W_k)":
        '坐标是按另一种约定配对的：在 rotate-half 配对 (x[i], x[i + d/2]) 的地方用了 (x[2i], x[2i+1])，或者反过来。每种约定对用它训练出的检查点都是正确的，但两者不能互换（它们相差 W_q 和 W_k 各列的一个置换）',
    'the diagonal is masked too: a query cannot see its own position':
        '对角线也被掩蔽了：查询看不到它自己的位置',
    'the frequencies are base^(+2i/d): the exponent lost its minus sign, so the pairs turn faster and faster instead of slower and slower':
        '频率写成了 base^(+2i/d)：指数丢了负号，于是各对坐标转得越来越快，而不是越来越慢',
    'the frequencies are base^(-i/d) instead of base^(-2i/d): the exponent misses its factor 2 (np.arange(d // 2) / d), so the slowest pair turns about sqrt(base) times too fast':
        '频率取成了 base^(-i/d)，而不是 base^(-2i/d)：指数漏掉了因子 2（np.arange(d // 2) / d），因此转得最慢的那对坐标快了约 sqrt(base) 倍',
    "the gain is (1 + weight), Gemma's convention (its checkpoints store weight - 1), instead of weight":
        '增益用的是 (1 + weight)，即 Gemma 的约定（它的检查点保存的是 weight - 1），而不是 weight',
    'the gate (N, L_q, n_heads) or (N, L_q, n_heads*head_dim) meets the (N, n_heads, L_q, head_dim) heads without its head axis moved in front of the positions (a reshape to (N, n_heads, L_q, .) without the transpose, or G[..., None] for a headwise gate, which broadcasts silently when L_q = n_heads): positions and heads are mixed, as in the split-heads bug':
        '门控 (N, L_q, n_heads) 或 (N, L_q, n_heads*head_dim) 与形状为 (N, n_heads, L_q, head_dim) 的各头相乘时，没有先把它的头轴移到位置轴前面（reshape 成 (N, n_heads, L_q, .) 却没有转置，或者对逐头门控用了 G[..., None]，当 L_q = n_heads 时它会悄无声息地广播）：位置和头被混在一起，和拆分头时的那个错误一样',
    "the gate belongs to the query: multiply row i of head i's output, sum_j a_ij v_j, by sigmoid(x_q[i] W_gate + b_gate). A gate on the values depends on the keys' tokens, not on the query's (Eq. gate-layer).":
        '门控属于查询：把头 i 输出的第 i 行 sum_j a_ij v_j 乘以 sigmoid(x_q[i] W_gate + b_gate)。作用在值上的门控取决于键的词元，而不是查询的词元（公式 gate-layer）。',
    'the gate is SiLU(a) = a * sigmoid(a) (the gate of a SwiGLU feed-forward network) instead of sigmoid(a)':
        '门控用的是 SiLU(a) = a * sigmoid(a)（SwiGLU 前馈网络的门控），而不是 sigmoid(a)',
    "the gate is computed from an output of the attention (the concatenated heads, or the ungated layer output) instead of from the layer's input x_q":
        '门控是由注意力的某个输出（拼接后的各头，或未经门控的层输出）计算的，而不是由层的输入 x_q 计算的',
    "the gate is computed from the keys' and values' input x_kv instead of the queries' input x_q (the same thing in self-attention; in cross-attention query i then gets the gate of key position i)":
        '门控由键和值的输入 x_kv 计算，而不是由查询的输入 x_q 计算（在自注意力中两者相同；在交叉注意力中，查询 i 于是得到键位置 i 的门控）',
    "the gate multiplies the layer's output after W^O (before or after b^O) instead of each head's output before W^O":
        '门控乘在了层经过 W^O 之后的输出上（在加 b^O 之前或之后），而不是乘在每个头进入 W^O 之前的输出上',
    "the gate reads the same input as the queries, G = sigmoid(x_q @ W_gate + b_gate), and does not depend on the attention at all; it multiplies the heads' output Y, it is not computed from it.":
        '门控读取与查询相同的输入，G = sigmoid(x_q @ W_gate + b_gate)，完全不依赖于注意力；它乘在各个头的输出 Y 上，而不是由 Y 计算得到。',
    'the heads are merged with a reshape and no transpose: reading (N, h, L, head_dim) as (N, L, h*head_dim) mixes positions across heads':
        '合并各头时只做了 reshape 而没有转置：把 (N, h, L, head_dim) 当作 (N, L, h*head_dim) 来读，会把不同头的位置混在一起',
    "the heads are merged with head_dim as the outer axis: the concatenation interleaves the heads' columns instead of putting head i's output in column block i":
        '合并各头时把 head_dim 当成了外层轴：拼接结果把各头的列交错排列，而不是把头 i 的输出放进第 i 个列块',
    "the heads are split with a reshape to (N, h, L, head_dim) and no transpose: 'head' i then holds a mixture of positions and column blocks, not X W_i^Q":
        '拆分各个头时直接重塑为 (N, h, L, head_dim)，没有转置：于是“头” i 装的是位置和列块的混合，而不是 X W_i^Q',
    'the heads are split with head_dim as the outer axis (a reshape to (N, L, head_dim, h)): head i gets every h-th column instead of the column block i':
        '拆分各个头时把 head_dim 当成了外层轴（重塑为 (N, L, head_dim, h)）：头 i 得到的是每隔 h 列取出的一列，而不是第 i 个列块',
    'the headwise gate is widened to the concatenated heads with np.tile, so coordinate c of the concatenation gets the gate of head c mod n_heads instead of head c // head_dim':
        '逐头门控用 np.tile 扩展到拼接后的各头，于是拼接结果的坐标 c 得到的是头 c mod n_heads 的门控，而不是头 c // head_dim 的',
    "the headwise gate multiplies the attention weights instead of the heads' outputs: the output comes out the same ((g A) V = g (A V)), but the weights returned are gated and their rows no longer sum to 1":
        '逐头门控乘在了注意力权重上，而不是各头的输出上：输出结果相同（(g A) V = g (A V)），但返回的权重经过了门控，各行之和不再为 1',
    'the key/value heads are repeated along the wrong axis (the positions, or the batch)':
        '键/值头沿错误的轴重复了（位置轴或批量轴）',
    'the key/value heads are repeated in the wrong order (tiled): query head j reads key/value head j % g instead of j // (h/g)':
        '键/值头的重复顺序错了（整体平铺）：查询头 j 读取的是键/值头 j % g，而不是 j // (h/g)',
    'the keys and values are computed from x_q instead of x_kv (self-attention code used for cross-attention)':
        '键和值是由 x_q 而不是 x_kv 计算的（把自注意力的代码用在了交叉注意力上）',
    "the keys are rotated but the queries are not, so a score sees the key's absolute position instead of the distance n - m":
        '键旋转了而查询没有旋转，因此分数看到的是键的绝对位置，而不是距离 n - m',
    'the l_q queries are the last l_q of the l_kv positions: p = l_kv - l_q + i, as in the causal mask (Eq. kv-chunk-mask).':
        'l_q 个查询是 l_kv 个位置中的最后 l_q 个：p = l_kv - l_q + i，与因果掩码相同（公式 kv-chunk-mask）。',
    'the learned gain `weight` is never applied':
        '从未乘上可学习的增益 `weight`',
    'the loop over key blocks skips the last block when L_kv is not a multiple of block_size':
        '当 L_kv 不是 block_size 的整数倍时，对键分块的循环跳过了最后一个分块',
    'the mask has the right pattern but holds numbers (1/0), not booleans':
        '掩码的模式正确，但存的是数值（1/0），而不是布尔值',
    'the mask is additive (0 where allowed, -inf or a large negative number where not), not boolean':
        '掩码是加性的（允许处为 0，不允许处为 -inf 或一个很大的负数），而不是布尔值',
    'the mask is inverted: True marks the forbidden (future) keys':
        '掩码取反了：True 标记的是被禁止的（未来的）键',
    'the mask is transposed: keys on the rows, or the upper triangle allowed (queries see the future)':
        '掩码被转置了：键在行上，或者允许的是上三角（查询能看到未来）',
    'the mask is used the wrong way round: True entries are blocked instead of allowed':
        '掩码用反了：值为 True 的项被掩蔽了，而它们本应是允许关注的',
    'the mask multiplies the weights after the softmax, without renormalising: the allowed weights no longer sum to 1':
        '掩码在 softmax 之后乘到权重上，而且没有重新归一化：允许的权重之和不再为 1',
    'the mean is subtracted, (x - mean) / sqrt(var + eps) * w: that is LayerNorm (without its bias), not RMSNorm':
        '减去了均值，(x - mean) / sqrt(var + eps) * w：这是 LayerNorm（不含偏置），而不是 RMSNorm',
    'the mean is taken without keepdims=True, so broadcasting divides entry j by the RMS of another vector (silently, when the last two axes have the same length)':
        '求均值时没有加 keepdims=True，因此广播时第 j 项被另一个向量的 RMS 去除（当最后两个轴长度相同时，这不会报错）',
    'the mean of the squares is taken over another axis than the last (or over several axes, or the whole array): the vectors are not normalised one by one':
        '平方的均值是沿最后一个轴以外的轴求的（或沿多个轴，或对整个数组）：各个向量没有被逐个归一化',
    'the middle axis':
        '中间的轴',
    'the new keys/values are put before the cached ones instead of after them':
        '新的键/值被放在了缓存中的键/值之前，而不是之后',
    'the new positions are rotated as positions 0 .. T-1 instead of P .. P+T-1: the P cached positions are forgotten, so every step rotates its q_rope and k_rope as if it were at the start of the sequence':
        '新位置被当作位置 0 .. T-1 来旋转，而不是 P .. P+T-1：P 个缓存位置被遗忘了，因此每一步都像位于序列开头那样旋转它的 q_rope 和 k_rope',
    'the new positions are rotated as positions 0 .. T-1 instead of c .. c+T-1: the c cached positions are forgotten, so every decoding step rotates its query and key as if they were at the start of the sequence':
        '新位置被当作位置 0 .. T-1 来旋转，而不是 c .. c+T-1：c 个已缓存的位置被遗忘了，于是每个解码步都把它的查询和键当作位于序列开头来旋转',
    "the new queries attend to the cached keys only: the new positions' own keys and values are appended after the attention instead of before":
        '新查询只关注缓存中的键：新位置自己的键和值在注意力之后才追加，而不是在之前',
    'the new queries see all the new keys: no causal mask inside a chunk of several new positions':
        '新查询能看到所有新键：在一段包含多个新位置的输入内部没有施加因果掩码',
    'the off-diagonal entries -a_i a_j matter: J = diag(a) - a a^T, so dS = A * (dA - rowsum(dA * A)).':
        '非对角项 -a_i a_j 不能忽略：J = diag(a) - a a^T，所以 dS = A * (dA - rowsum(dA * A))。',
    'the output bias b_o is not added':
        '没有加上输出偏置 b_o',
    "the output gate is the sigmoid itself, G = sigmoid(x_q @ W_gate + b_gate), between 0 and 1; SiLU's extra factor a makes it unbounded and negative for a < 0.":
        '输出门控就是 sigmoid 本身，G = sigmoid(x_q @ W_gate + b_gate)，取值在 0 和 1 之间；SiLU 多出的因子 a 会使它无界，并在 a < 0 时为负。',
    'the output is the accumulator itself: it is never divided by the running sum l':
        '输出就是累加器本身：它从未除以运行和 l',
    'the projection biases b_q, b_k, b_v are not added (b_o is)':
        '没有加上投影偏置 b_q、b_k、b_v（b_o 加上了）',
    "the queries are rotated but the new keys are not (they are attended and cached unrotated), so a score sees the query's absolute position instead of the distance n - m":
        '查询旋转了，新键却没有旋转（它们未经旋转就参与注意力并被缓存），因此分数反映的是查询的绝对位置，而不是距离 n - m',
    'the query bias b_q is not added':
        '没有加上查询偏置 b_q',
    'the rescaling factor is exp(m_new - m_old) instead of exp(m_old - m_new)':
        '重缩放因子用的是 exp(m_new - m_old)，而不是 exp(m_old - m_new)',
    'the result keeps a separate group axis, (N, g, n_rep, L, d), instead of (N, g*n_rep, L, d)':
        '结果保留了一个单独的组轴，形状为 (N, g, n_rep, L, d)，而不是 (N, g*n_rep, L, d)',
    'the returned cache holds per-head tensors (the rebuilt keys c W_uk_i, the values c W_uv_i, or the shared rotary key copied to every head) instead of one latent and one rotary key per position: n_heads times what a head needs, and exactly what multi-head latent attention exists to avoid':
        '返回的缓存保存的是每个头各自的张量（重建的键 c W_uk_i、值 c W_uv_i，或复制到每个头的共享旋转键），而不是每个位置一个潜在向量和一个旋转键：这是一个头所需的 n_heads 倍，而这正是多头潜在注意力要避免的',
    'the returned cache holds the repeated heads (n_heads per position) instead of the n_kv_heads key/value heads, so it is n_heads / n_kv_heads times too large':
        '返回的缓存保存的是重复后的头（每个位置 n_heads 个），而不是 n_kv_heads 个键/值头，因此大了 n_heads / n_kv_heads 倍',
    'the returned caches are the old ones: the new keys and values are not appended':
        '返回的缓存是旧的：新的键和值没有追加进去',
    'the returned caches are the old ones: the new latents and rotary keys are not appended':
        '返回的是旧缓存：新的潜在向量和旋转键没有追加进去',
    'the row sum in the softmax backward is of dA alone, sum_j dA_j, instead of sum_j dA_j A_j':
        'softmax 反向传播中的行和只对 dA 求和，即 sum_j dA_j，而不是 sum_j dA_j A_j',
    'the row sum is taken without keepdims, so broadcasting subtracts the sum of another row (silently, when the last two axes have the same length)':
        '求行和时没有用 keepdims，所以广播减去的是另一行的和（当最后两个轴长度相同时，不会报错）',
    'the row-sum term of the softmax backward has the wrong sign: A * (dA + rowsum(dA * A))':
        'softmax 反向传播中行和项的符号反了：A * (dA + rowsum(dA * A))',
    'the running sum l is not rescaled by alpha = exp(m_old - m_new) when the running maximum grows':
        '运行最大值增大时，运行和 l 没有乘以 alpha = exp(m_old - m_new) 进行重缩放',
    'the scale uses d_v, the width of the values, instead of d_k, the width of the queries and keys':
        '缩放因子用了值的宽度 d_v，而不是查询和键的宽度 d_k',
    'the scale uses the number of keys L_kv (k.shape[-2]) instead of the key width d_k (k.shape[-1])':
        '缩放因子用的是键的个数 L_kv（k.shape[-2]），而不是键的宽度 d_k（k.shape[-1]）',
    'the scores are divided by d_k instead of sqrt(d_k)':
        '分数除以了 d_k，而不是 sqrt(d_k)',
    'the scores are multiplied by sqrt(d_k) instead of divided by it':
        '分数乘以了 sqrt(d_k)，而不是除以它',
    'the scores are not scaled: softmax(QK^T) instead of softmax(QK^T / sqrt(d_k))':
        '分数没有缩放：算的是 softmax(QK^T)，而不是 softmax(QK^T / sqrt(d_k))',
    'the scores are scaled by 1/sqrt(d_c + d_r), the width of the absorbed query [q_nope W_uk^T, R q_rope] and of the cached rows [c, k_rope], instead of 1/sqrt(d_n + d_r)':
        '分数按 1/sqrt(d_c + d_r) 缩放（这是吸收后的查询 [q_nope W_uk^T, R q_rope] 和缓存行 [c, k_rope] 的宽度），而不是按 1/sqrt(d_n + d_r) 缩放',
    'the scores are scaled by 1/sqrt(d_model) instead of 1/sqrt(d_k) (the head size): the scores shrink by a further factor sqrt(n_heads) and the weights come out too flat':
        '分数按 1/sqrt(d_model) 缩放，而不是按 1/sqrt(d_k)（头维度）缩放：分数又多缩小了 sqrt(n_heads) 倍，权重因此过于平坦',
    "the scores are scaled by 1/sqrt(d_n), the width of the no-position part alone, instead of 1/sqrt(d_n + d_r), the width of a head's whole query and key":
        '分数按 1/sqrt(d_n) 缩放（这只是不含位置信息那部分的宽度），而不是按 1/sqrt(d_n + d_r) 缩放（一个头完整的查询和键的宽度）',
    "the scores' exponentials are shifted by the row maximum but the sink's is not: the sum adds exp(sink) to sum_j exp(S_j - m), two terms on different scales":
        '分数的指数按行最大值做了平移，而汇聚点的指数没有：求和时把 exp(sink) 加到 sum_j exp(S_j - m) 上，这两项的尺度不同',
    "the sigmoid is missing: the gate's logits x_q W_gate + b_gate multiply the heads' outputs directly, so the 'gate' is unbounded and can be negative":
        '缺少 sigmoid：门控的 logits x_q W_gate + b_gate 直接乘到各个头的输出上，因此这个“门控”没有界，还可能为负',
    "the sink is left in the output: the weights come back with the sink's column, L_kv + 1 columns instead of L_kv":
        '汇聚点留在了输出中：返回的权重带着汇聚点那一列，共 L_kv + 1 列，而不是 L_kv 列',
    'the sink logit changes nothing: every row of the weights sums to 1, as without a sink (the sink is ignored, or added to every score of its row, which the softmax cancels, or its column is dropped and the rows renormalised)':
        '汇聚点 logit 没有起任何作用：权重的每一行之和都为 1，就像没有汇聚点一样（汇聚点被忽略了；或者被加到了所在行的每个分数上，而 softmax 会把它抵消；或者它那一列被丢弃后各行又重新归一化了）',
    'the sink logit is multiplied by the scale 1/sqrt(d_k) like the scores, but it is a logit of its own, not a dot product':
        '汇聚点 logit 像分数一样乘上了缩放因子 1/sqrt(d_k)，但它是一个独立的 logit，不是点积',
    'the sink logits are indexed by the query instead of the head: broadcast along the wrong axis (sinks[:, None] against (..., L_q, L_kv) scores), query i gets sinks[i] (silently, when L_q equals the number of heads)':
        '汇聚点 logit 是按查询而不是按头索引的：沿错误的轴做了广播（sinks[:, None] 与形状为 (..., L_q, L_kv) 的分数相配），查询 i 得到的是 sinks[i]（当 L_q 恰好等于头数时，不会报错）',
    'the sliding window restricts the causal mask: both j <= p and j > p - window.':
        '滑动窗口是在因果掩码上再加限制：要同时满足 j <= p 和 j > p - window。',
    'the softmax backward is dS = A * dA: the term from -a a^T of the Jacobian, the row sum, is missing':
        'softmax 的反向传播写成了 dS = A * dA：缺少来自雅可比矩阵中 -a a^T 的那一项，即行和',
    "the softmax backward uses only the diagonal of the Jacobian: dS = A (1 - A) dA (the sigmoid's derivative)":
        'softmax 的反向传播只用了雅可比矩阵的对角线：dS = A (1 - A) dA（这是 sigmoid 的导数）',
    'the softmax exponentiates the scores without subtracting the row maximum, so exp overflows to inf for large logits (inf / inf = NaN)':
        'softmax 对分数取指数前没有减去行最大值，因此 logits 很大时 exp 上溢为 inf（inf / inf = NaN）',
    'the softmax normalised each row over the last axis, so its backward sums over the last axis too.':
        'softmax 沿最后一个轴对每一行做了归一化，所以它的反向传播也沿最后一个轴求和。',
    'the softmax normalises along the wrong axis (or over all entries at once): the entries along `axis` do not sum to 1':
        'softmax 沿错误的轴做了归一化（或者一次性对所有项归一化）：沿 `axis` 的各项之和不为 1',
    'the softmax runs over the queries (axis -2) instead of over the keys (axis -1): the columns of the weights sum to 1 instead of the rows':
        'softmax 是在查询上（轴 -2）而不是在键上（轴 -1）计算的：权重中和为 1 的是各列，而不是各行',
    "the softmax subtracts a maximum that is not the row's own (the maximum of the whole array, or along another axis), so a row far below that maximum underflows to 0 / 0 = NaN":
        'softmax 减去的不是该行自己的最大值（而是整个数组的最大值，或沿另一个轴的最大值），因此远低于这个最大值的行会下溢，得到 0 / 0 = NaN',
    'the split transposes the wrong axes: the result is (N, h, head_dim, L) (or another order), not (N, h, L, head_dim)':
        '拆分时转置了错误的轴：结果是 (N, h, head_dim, L)（或其他顺序），而不是 (N, h, L, head_dim)',
    'the squares are summed, not averaged: x / sqrt(sum(x^2) + eps) normalises to length 1, which is sqrt(d) times smaller than RMS 1':
        '平方项被求和而不是求平均：x / sqrt(sum(x^2) + eps) 把向量归一化到长度 1，比 RMS 为 1 时小 sqrt(d) 倍',
    'the sum is taken without keepdims=True, so broadcasting divides each entry by the sum of another row (silently, when the array is square)':
        '求和时没有加 keepdims=True，因此广播时每一项被另一行的和去除（当数组是方阵时，这不会报错）',
    'the sum of the softmax backward runs over axis -2 (a column) instead of the last axis (the row)':
        'softmax 反向传播中的求和沿轴 -2（一列）进行，而不是沿最后一个轴（一行）',
    'the two coordinates of a pair turn by different angles: the cos/sin tables are laid out for the other pairing (theta repeated pairwise, np.repeat / repeat_interleave, where the pairs are (x[i], x[i + d/2]), or the two halves [theta, theta] concatenated where the pairs are (x[2i], x[2i+1])), so the map is no longer a rotation':
        '一对中的两个坐标转过了不同的角度：cos/sin 表是按另一种配对方式排布的（在配对为 (x[i], x[i + d/2]) 时把 theta 成对重复，即 np.repeat / repeat_interleave；或者在配对为 (x[2i], x[2i+1]) 时把两半 [theta, theta] 拼接起来），因此这个映射不再是旋转',
    'the value bias b_v is not added':
        '没有加上值的偏置 b_v',
    'the values are projected with W_k (and b_k) instead of W_v':
        '值是用 W_k（和 b_k）投影的，而不是用 W_v',
    'the values are rotated too (RoPE applied to q, k and v): the output and the value cache come out rotated':
        '值也被旋转了（RoPE 作用于 q、k 和 v）：输出和值缓存都是旋转过的',
    'the weights are averaged over the heads, (N, L_q, L_kv), as torch.nn.MultiheadAttention does by default, instead of returned per head, (N, h, L_q, L_kv)':
        '权重在各头上取了平均，形状为 (N, L_q, L_kv)（torch.nn.MultiheadAttention 默认如此），而不是按头返回，形状为 (N, h, L_q, L_kv)',
    'the window is aligned top-left: query i is taken to sit at position i instead of l_kv - l_q + i, so after a KV cache the new queries look at the oldest keys':
        '窗口按左上角对齐：查询 i 被当作位于位置 i，而不是 l_kv - l_q + i，因此在键值缓存之后，新查询看到的是最旧的那些键',
    'the window is not applied: the mask is the plain causal mask, every query sees every earlier key':
        '没有应用窗口：掩码只是普通的因果掩码，每个查询都能看到所有更早的键',
    'the window is off by one: each query sees only window - 1 keys (j > p - window + 1), itself and window - 2 earlier ones':
        '窗口大小差了一：每个查询只能看到 window - 1 个键（j > p - window + 1），即它自己和之前的 window - 2 个键',
    "the window is off by one: each query sees window + 1 keys (j >= p - window, or p - j <= window), the convention that counts only the past keys (FlashAttention's window_size=(left, 0) is window = left + 1 here)":
        '窗口大小差了一：每个查询能看到 window + 1 个键（j >= p - window，或 p - j <= window），这是只计过去的键的约定（FlashAttention 的 window_size=(left, 0) 在这里是 window = left + 1）',
    "the window is symmetric around the query, |p - j| < window (Longformer's local attention): the queries also see the next window - 1 keys":
        '窗口以查询为中心对称，|p - j| < window（Longformer 的局部注意力）：查询还能看到之后的 window - 1 个键',
    "there is no gate: the output is the plain layer's Concat(head_1, ..., head_h) W^O + b^O, no head's output multiplied by sigmoid(x_q W_gate + b_gate)":
        '没有门控：输出就是普通层的 Concat(head_1, ..., head_h) W^O + b^O，没有任何头的输出乘以 sigmoid(x_q W_gate + b_gate)',
    'theta_i = base ** (-2 * i / d) for i = 0 .. d/2 - 1, i.e. base ** (-np.arange(0, d, 2) / d).':
        '对 i = 0 .. d/2 - 1，theta_i = base ** (-2 * i / d)，即 base ** (-np.arange(0, d, 2) / d)。',
    'theta_i = base ** (-2i/d) = 1 / base ** (2i/d): pair 0 turns by one radian per position, the last pair by about 1/base.':
        'theta_i = base ** (-2i/d) = 1 / base ** (2i/d)：第 0 对每个位置转一弧度，最后一对每个位置约转 1/base 弧度。',
    'theta_i = base ** (-2i/d) with the base passed in (Llama 3 uses 500000: a larger base is how several models stretch their context).':
        'theta_i = base ** (-2i/d)，其中 base 取传入的值（Llama 3 用的是 500000：好几个模型正是靠更大的 base 来拉长上下文）。',
    "torch's .view() was called on a non-contiguous tensor (after a transpose, or on an input that is itself a transposed view), and raised":
        '在非连续存储的张量上（转置之后，或者在本身就是转置视图的输入上）调用了 torch 的 .view()，因而报错',
    "transpose to (N, L, h, head_dim), then reshape: Concat(head_1, ..., head_h) puts head_1's columns first (Eq. multihead-wo-blocks).":
        '先转置为 (N, L, h, head_dim)，再重塑：Concat(head_1, ..., head_h) 把 head_1 的列放在最前面（公式 multihead-wo-blocks）。',
    'use .reshape(...), or .contiguous().view(...): a transpose changes the strides, not the memory.':
        '使用 .reshape(...) 或 .contiguous().view(...)：转置改变的是步长，而不是内存中的数据。',
    'use the `axis` argument for both the max and the sum: e.sum(axis=axis, keepdims=True).':
        '求最大值和求和都要使用参数 `axis`：e.sum(axis=axis, keepdims=True)。',
    'use the eps passed in, under the square root; with none, a zero vector gives 0 / 0.':
        '使用传入的 eps，并把它放在平方根里面；没有 eps 时，零向量会得到 0 / 0。',
    'v (transposed views)':
        'v（转置视图）',
    'weight ({0},)':
        'weight ({0},)',
    'weights ({0}, {1})':
        'weights ({0}, {1})',
    'weights ({0}, {1}, {2})':
        'weights ({0}, {1}, {2})',
    'weights ({0}, {1}, {2}, {3})':
        'weights ({0}, {1}, {2}, {3})',
    'weights ({0},)':
        'weights ({0},)',
    "weights V, the weights of softmax([scale QK^T | sink]) without the sink's column":
        'weights V，其中 weights 是 softmax([scale QK^T | sink]) 去掉汇聚点那一列后的权重',
    'when T > 1 positions arrive at once after c cached ones, query i may attend to key j iff j <= c + i (Eq. kv-chunk-mask); a single new position (T = 1) needs no mask.':
        '当 c 个已缓存位置之后一次到来 T > 1 个位置时，查询 i 可以关注键 j 当且仅当 j <= c + i（公式 kv-chunk-mask）；只有一个新位置（T = 1）时不需要掩码。',
    "when mask is not None, set the scores of the forbidden keys to -inf before the softmax: np.where(mask, scores, -np.inf) (torch: scores.masked_fill(~mask, float('-inf'))); in multi-head attention, pass the mask on to the attention of every head.":
        "当 mask 不为 None 时，在 softmax 之前把被禁止的键的分数设为 -inf：np.where(mask, scores, -np.inf)（torch：scores.masked_fill(~mask, float('-inf'))）；在多头注意力中，要把掩码传给每个头的注意力。",
    "when params has 'b_gate', add it to the logits before the sigmoid (it has the gate's width: h or h*head_dim).":
        "当 params 中有 'b_gate' 时，在 sigmoid 之前把它加到 logits 上（它的宽度与门控相同：h 或 h*head_dim）。",
    'window {0}':
        '窗口为 {0}',
    'with NumPy arrays':
        '使用 NumPy 数组时',
    'with biases':
        '带偏置',
    'with torch tensors':
        '使用 torch 张量时',
    "work on new arrays: x = x - x.max(axis, keepdims=True) creates one; x -= ... overwrites the caller's data.":
        '在新数组上计算：x = x - x.max(axis, keepdims=True) 会创建一个新数组；x -= ... 则会覆盖调用者的数据。',
    'x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps): the difference shows when the RMS of x is near sqrt(eps), as for small activations.':
        'x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps)：当 x 的 RMS 接近 sqrt(eps) 时（例如激活值很小时），两者的差别就会显现。',
    'x / sqrt(mean(x^2 over the last axis) + eps) * weight':
        'x / sqrt(mean(x^2) + eps) * weight（mean 沿最后一个轴计算）',
    'x is divided by sqrt(var(x) + eps), the standard deviation, instead of the root mean square sqrt(mean(x^2) + eps): the two differ whenever the mean of x is not 0':
        'x 除以的是标准差 sqrt(var(x) + eps)，而不是均方根 sqrt(mean(x^2) + eps)：只要 x 的均值不为 0，两者就不同',
    'x_kv and W_gate (transposed views)':
        'x_kv 和 W_gate（转置视图）',
    'x_kv and W_q (transposed views)':
        'x_kv 和 W_q（转置视图）',
    'x_kv is not x_q':
        'x_kv 不是 x_q',
    "y = x_hat * weight. Gemma's RMSNorm multiplies by (1 + weight) because its weights start at 0; a weight stored that way must be converted, not used as it is.":
        'y = x_hat * weight。Gemma 的 RMSNorm 乘以 (1 + weight)，因为它的权重从 0 开始；以这种方式存储的权重必须先转换，不能直接使用。',
    'y.reshape(N, L, h, head_dim) with axes 1 and 2 swapped: heads[n, i] = column block i':
        'y.reshape(N, L, h, head_dim) 再交换轴 1 和轴 2：heads[n, i] = 第 i 个列块',
    'y.reshape(N, L, h, head_dim), then swap only axes 1 and 2 (np.swapaxes(r, 1, 2) / r.transpose(1, 2)).':
        '先 y.reshape(N, L, h, head_dim)，再只交换轴 1 和轴 2（np.swapaxes(r, 1, 2) / r.transpose(1, 2)）。',
    'your function builds a whole L_q x L_kv array (the scores, the weights or a mask) at some point of the call, so its memory grows with L_q * L_kv instead of L_q times the tile width':
        '你的函数在调用过程中的某一时刻构建了一个完整的 L_q x L_kv 数组（分数、权重或掩码），因此它的内存随 L_q * L_kv 增长，而不是随 L_q 乘以分块宽度增长',
    'your function changed one of its inputs in place (for example x -= x.max(...), or masked_fill_)':
        '你的函数就地修改了它的某个输入（例如 x -= x.max(...)，或者 masked_fill_）',
    'your function returns the right arrays in the wrong order':
        '你的函数返回的数组是对的，但顺序错了',
    '{0} heads':
        '{0} 个头',
    '{0} key/value heads':
        '{0} 个键/值头',
    '{0} new position after {1} cached':
        '已缓存 {1} 个位置之后的 {0} 个新位置',
    '{0} new position after {1} cached (at position {2})':
        '已缓存 {1} 个位置之后的 {0} 个新位置（位于位置 {2}）',
    '{0} new positions after {1} cached':
        '已缓存 {1} 个位置之后的 {0} 个新位置',
    '{0} new positions after {1} cached (at positions {2} .. {3})':
        '已缓存 {1} 个位置之后的 {0} 个新位置（位于位置 {2} .. {3}）',
    '{0} positions':
        '{0} 个位置',
    "{checker}: case '{case}': the call allocated up to {peak} MiB at once, at least {budget} of one {length} x {length} float64 matrix ({matrix} MiB).\n":
        '{checker}：用例“{case}”：这次调用一度同时分配了多达 {peak} MiB 内存，至少是一个 {length} x {length} float64 矩阵（{matrix} MiB）的 {budget}。\n',
    "{checker}: case '{case}'{inputs}":
        '{checker}：用例“{case}”{inputs}',
    '{header}: after the call, {names} no longer held what was passed in.\n':
        '{header}：调用之后，{names} 已不再是传入时的值。\n',
    '{header}: your function did not return within {timeout} s, so the checker stopped it{at}.\nHint: look for an infinite loop (a while loop whose condition never turns false, a counter that is never incremented) or a very slow loop over single elements; these cases hold a few dozen numbers, so a correct function returns in well under a second. To wait longer, pass timeout=<seconds> (timeout=None: no limit).':
        '{header}：你的函数没有在 {timeout} 秒内返回，因此检验函数停止了它{at}。\n提示：检查是否有无限循环（条件永远不会变为假的 while 循环、从不递增的计数器），或逐个元素进行的非常慢的循环；这些用例只包含几十个数，正确的函数远不到一秒就能返回。如需等待更久，请传入 timeout=<seconds>（timeout=None：不限时）。',
    '{header}: your function raised {raised}\n':
        '{header}：你的函数抛出了异常 {raised}\n',
    '{header}: your function returned a {kind} of {n} values; expected one array, {names}':
        '{header}：你的函数返回了一个含 {n} 个值的 {kind}；应当只返回一个数组，即 {names}',
    '{header}: your function returned {got}; expected a tuple of {n} arrays ({names})':
        '{header}：你的函数返回了 {got}；期望的是由 {n} 个数组组成的元组（{names}）',
    '{header}: {name} differs from {formula} ({equation}).\n':
        '{header}：{name} 与 {formula}（{equation}）不一致。\n',
    '{header}: {name} is a {kind}, not an array of numbers':
        '{header}：{name} 是 {kind}，而不是数值数组',
}
