"""What trained heads do: attention-pattern scores, redundancy between heads, importance and pruning.

Book: part III, "What heads learn".

Three groups of functions, one per question of the chapter:

* **Patterns.** From a layer's attention weights ``(N, h, L, L)`` (causal self-attention, rows summing to 1):
  :func:`offset_profile`, :func:`previous_token_score`, :func:`induction_score`, :func:`positional_score`,
  :func:`diffuse_score`, :func:`top_key_score`, gathered by :func:`head_scores` and turned into a class per head by
  :func:`classify_heads` (thresholds in :data:`THRESHOLDS`). :func:`attention_maps` runs a model and returns
  every layer's weights as NumPy arrays; :func:`repeat_induction_scores` measures the induction score of a
  model's heads on repeated random sequences of several lengths.
* **Redundancy.** :func:`js_divergence` and :func:`pairwise_head_js` (how differently two heads distribute their
  attention over the same input); :func:`principal_angles`, :func:`subspace_overlap` and
  :func:`pairwise_subspace_overlap` (how much the subspaces that two heads read from, or write to, share).
* **Importance and pruning** (Michel, Levy and Neubig 2019): :func:`head_importance` (I_h = E_x |dL(x)/d xi_h|
  through the model's ``head_mask``, normalised per layer), :func:`single_head_ablation` (the measured effect of
  removing one head), :func:`pruning_masks` and :func:`prune_curve`
  (quality against the fraction of heads removed, in one of :data:`PRUNE_ORDERS`), :func:`prunable_fraction`.


Pattern and redundancy functions take NumPy arrays or torch tensors and compute in float64 NumPy; importance and
pruning run the torch model. One module per group (:mod:`.patterns`, :mod:`.redundancy`, :mod:`.importance`); every
name is also here, as ``mha.experiments.analysis.<name>``.
"""


from mha.experiments.analysis.importance import (PRUNE_ORDERS, head_importance, prunable_fraction, prune_curve,
                                                 pruning_masks, single_head_ablation)
from mha.experiments.analysis.patterns import (HEAD_CLASSES, SELECTIVE_THRESHOLD, THRESHOLDS, attention_maps,
                                               classify_heads, diffuse_score, head_scores, induction_score,
                                               offset_profile, positional_score, previous_token_score,
                                               repeat_induction_scores, top_key_score)
from mha.experiments.analysis.redundancy import (head_blocks, js_divergence, off_diagonal, pairwise_head_js,
                                                 pairwise_subspace_overlap, principal_angles, subspace_overlap)

__all__ = ["HEAD_CLASSES", "THRESHOLDS", "SELECTIVE_THRESHOLD", "attention_maps", "offset_profile",
           "previous_token_score", "induction_score", "repeat_induction_scores", "positional_score", "diffuse_score",
           "top_key_score", "head_scores", "classify_heads", "js_divergence", "pairwise_head_js", "off_diagonal",
           "principal_angles", "subspace_overlap", "head_blocks", "pairwise_subspace_overlap", "head_importance",
           "single_head_ablation", "pruning_masks", "PRUNE_ORDERS", "prune_curve", "prunable_fraction"]
