"""The experiments as functions: one training run, what heads learn, training dynamics, and the Shakespeare run.

Book: part III. Each study takes its configuration (:mod:`mha.experiments.config`), trains through the one trainer
(:func:`mha.experiments.train.train`, with hooks where it measures more), and returns a dict: ``metrics`` (the
scalars a sweep copies into ``results.csv``, with the machine that ran) and whatever the study's notebook plots.
With ``out_dir`` it writes ``metrics.json`` there (last: its presence marks the run complete) and the files the book
plots into ``artifacts_dir`` (default :func:`mha.experiments.io.artifacts_dir`).

:data:`STUDIES` is the one registry of the studies (name -> configuration class and function). A run goes through
:func:`run_config` both ways a sweep runs it: the papermill templates in ``experiments/notebooks/`` (a parameters
cell, ``make_config`` and ``run_config``, then figures) and ``python -m mha.sweep ... --executor function``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from mha._checks import check_choice, check_type
from mha.experiments import analysis
from mha.experiments.config import DynamicsRun, HeadsRun, RunConfig, ShakespeareRun, TrainRun
from mha.experiments.io import artifacts_dir as default_artifacts_dir
from mha.experiments.io import rounded, save_json
from mha.experiments.machine import machine_info, machine_load, seed_everything, set_threads
from mha.experiments.model import TinyTransformer
from mha.experiments.probes import (DynamicsProbe, count_spikes, first_token_attention, fixed_period_probe,
                                   head_ablations)
from mha.experiments.tasks import RepeatedSequence
from mha.experiments.train import evaluate, measure_decode_time, train

__all__ = ["run_train", "run_heads", "run_dynamics", "run_shakespeare", "Study", "STUDIES", "make_config", "run_config",
           "run_study"]


def _prepare(config: RunConfig, cls: type, out_dir, artifacts_dir):
    """Check the arguments, set the thread count; return (out_dir, artifacts_dir) as Paths or None."""
    check_type("config", config, cls, f"a {cls.__name__} (mha.experiments.config)")
    set_threads(config.threads)
    if out_dir in (None, ""):
        return None, None
    out_dir = Path(out_dir)
    return out_dir, Path(artifacts_dir) if artifacts_dir else default_artifacts_dir(out_dir)


def _finish(metrics: dict, out_dir, artifacts: dict, artifacts_path, compact: bool = True) -> None:
    """Write the artifacts, then metrics.json (last: it marks the run complete)."""
    if out_dir is None:
        return
    for name, content in artifacts.items():
        save_json(content, artifacts_path / f"{name}.json", compact=compact)
    save_json(metrics, out_dir / "metrics.json")


def _record_machine(metrics: dict, config: RunConfig, device: torch.device) -> dict:
    """Add the machine (CPU model or GPU name, thread count, versions), the run's threads, and what the run used: its
    study and complete configuration (the sweep runner checks them against what it asked for)."""
    metrics.update(machine_info(device))
    metrics["threads"] = config.threads
    metrics["study"] = config.study
    metrics["config"] = config.to_dict()
    return metrics


# --------------------------------------------------------------------------------------------------- train
def run_train(config: TrainRun, out_dir=None, artifacts_dir=None) -> dict:
    """One training run; with ``measure_decode``, the seconds per token of KV-cache decoding afterwards. The
    validation history (every evaluation) is kept as the artifact ``history.json``.

    Book: part III, "Head count" and "MHA, GQA and MQA in training". Returns {"metrics", "model", "task"}.
    """
    out_dir, artifacts_path = _prepare(config, TrainRun, out_dir, artifacts_dir)
    task = config.make_task()
    model_config = config.model_config(task)
    result = train(model_config, task, config.train, progress=config.progress)
    model = result.model.eval()
    metrics = dict(result)
    if config.measure_decode:
        decode_len = config.decode_len or task.block_size
        decode_model = model
        if decode_len > model_config.block_size:  # the trained weights with a longer position table (its extra rows
            # keep their initialisation: they only make room for a longer KV cache; the time per token does not
            # depend on them)
            decode_model = TinyTransformer(replace(model_config, block_size=decode_len)).to(model.lm_head.weight.device)
            decode_model.load_state_dict({k: v for k, v in model.state_dict().items() if k != "pos_emb.weight"},
                                         strict=False)
            with torch.no_grad():
                decode_model.pos_emb.weight[:model_config.block_size] = model.pos_emb.weight
        prompt_len = max(1, decode_len // 2)
        metrics["decode_s_per_token"] = measure_decode_time(decode_model, prompt_len, decode_len - prompt_len,
                                                            batch_size=config.decode_batch_size)
        metrics["decode_kv_cache_bytes"] = decode_model.kv_cache_bytes(config.decode_batch_size, decode_len,
                                                                       dtype_bytes=4)
    _record_machine(metrics, config, model.lm_head.weight.device)
    _finish(metrics, out_dir, {"history": rounded(result["history"])}, artifacts_path)
    return dict(metrics=metrics, model=model, task=task)


# --------------------------------------------------------------------------------------------------- heads
def _subspace_matrices(net: TinyTransformer, statistic: str) -> dict:
    """{"q", "k", "v", "o"} -> (n_layers, h, h) overlaps between the heads' blocks (W_o transposed)."""
    out = {name: [] for name in "qkvo"}
    for block in net.blocks:
        params = block.attn.export_params()  # W_q (d, h hd), W_k, W_v (d, g hd), W_o (h hd, d)
        h, g = block.attn.n_heads, block.attn.n_kv_heads
        for name, matrix, heads in (("q", params["W_q"], h), ("k", params["W_k"], g), ("v", params["W_v"], g),
                                    ("o", params["W_o"].T, h)):
            out[name].append(analysis.pairwise_subspace_overlap(matrix, heads, statistic))
    return {name: np.array(mats) for name, mats in out.items()}


def run_heads(config: HeadsRun, out_dir=None, artifacts_dir=None) -> dict:
    """Train, then ask the heads three questions (:mod:`mha.experiments.analysis`): their patterns and classes,
    how redundant they are (Jensen-Shannon divergence of their rows, overlap of their subspaces, trained and at
    initialisation), and how important (Michel et al.'s importance, normalised and raw, and the signed mean
    derivative; single-head ablations; pruning curves by importance, raw importance, measured ablation and at
    random). The classes are recorded twice: as :func:`~mha.experiments.analysis.classify_heads` files them by
    default, and with the "selective" class (:data:`~mha.experiments.analysis.SELECTIVE_THRESHOLD`).

    Book: part III, "What heads learn". Returns {"metrics", "model", "task", "details", "weights", "table"}.
    """
    out_dir, artifacts_path = _prepare(config, HeadsRun, out_dir, artifacts_dir)
    task = config.make_task()
    model_config = config.model_config(task)
    result = train(model_config, task, config.train, progress=config.progress)
    model = result.model.eval()
    device = next(model.parameters()).device
    n_heads = config.model.n_heads

    analysis_start = time.perf_counter()

    def held_out(count):
        return [task.get_batch("val", config.analysis_batch_size, device) for _ in range(count)]

    x_scores, _ = held_out(1)[0]  # (N, L): scores, divergences, the example map (its first sequence)
    eval_set = held_out(config.prune_eval_batches)  # pruned models are evaluated here
    importance_set = held_out(config.importance_batches)  # head importance is estimated here

    # Patterns and classes
    weights = analysis.attention_maps(model, x_scores)  # n_layers x (N, h, L, L)
    block = model_config.block_size
    periods = (list(range(4, (block + 1) // 2 + 1, 4)) if config.induction_periods is None
               else list(config.induction_periods))
    induction_by_period = analysis.repeat_induction_scores(model, periods, config.analysis_batch_size,
                                                           seed=config.train.seed)  # (P, n_layers, h)
    scores = []
    for layer, w in enumerate(weights):
        layer_scores = analysis.head_scores(w)
        layer_scores["induction"] = induction_by_period[:, layer].mean(axis=0)
        scores.append(layer_scores)
    classes = [analysis.classify_heads(s) for s in scores]
    classes_selective = [analysis.classify_heads(s, selective=analysis.SELECTIVE_THRESHOLD) for s in scores]

    # Redundancy
    js = np.array([analysis.pairwise_head_js(w) for w in weights])  # (n_layers, h, h)
    overlap = _subspace_matrices(model, "mean_cos2")
    max_cos = _subspace_matrices(model, "max_cos")
    seed_everything(config.train.seed)  # the same initialisation as train() drew
    overlap_init = _subspace_matrices(TinyTransformer(model_config), "mean_cos2")

    # Importance and pruning
    importance = analysis.head_importance(model, importance_set)  # (n_layers, h), each row of unit L2 norm
    importance_raw = analysis.head_importance(model, importance_set, normalize=False)  # E|dL/dxi|, (n_layers, h)
    derivative = analysis.head_importance(model, importance_set, normalize=False, signed=True)  # E[dL/dxi]
    ablation = analysis.single_head_ablation(model, eval_set, task.has_accuracy)  # one head masked at a time
    curve_importance = analysis.prune_curve(model, eval_set, importance_set, order="importance",
                                            has_accuracy=task.has_accuracy)
    curves_random = [analysis.prune_curve(model, eval_set, order="random", seed=config.train.seed + k,
                                          has_accuracy=task.has_accuracy) for k in range(config.random_orders)]
    curve_raw, curve_ablation = (analysis.prune_curve(model, eval_set, importance_set, order=order,
                                                      has_accuracy=task.has_accuracy)
                                 for order in ("raw_importance", "ablation"))
    metric = "val_acc" if task.has_accuracy else "val_loss"
    prunable_importance = analysis.prunable_fraction(curve_importance, config.prune_tolerance, metric)
    prunable_random = float(np.mean([analysis.prunable_fraction(c, config.prune_tolerance, metric)
                                     for c in curves_random]))

    def mean_off_diagonal(matrices):
        return float(np.mean([analysis.off_diagonal(m).mean() for m in matrices])) if n_heads > 1 else None

    all_classes = [c for layer_classes in classes for c in layer_classes]
    summary = {f"n_{name.replace('-', '_')}": all_classes.count(name) for name in analysis.HEAD_CLASSES}
    summary.update(
        js_mean=mean_off_diagonal(js),
        js_min=float(min(analysis.off_diagonal(m).min() for m in js)) if n_heads > 1 else None,
        **{f"overlap_{n}": mean_off_diagonal(overlap[n]) for n in "qkvo"},
        **{f"overlap_{n}_init": mean_off_diagonal(overlap_init[n]) for n in "qkvo"},
        **{f"maxcos_{n}": mean_off_diagonal(max_cos[n]) for n in "qkvo"},
        overlap_random=model.head_dim / config.model.d_model,
        prune_metric=metric, prunable_importance=prunable_importance, prunable_random=prunable_random,
        prunable_raw=analysis.prunable_fraction(curve_raw, config.prune_tolerance, metric),
        prunable_ablation=analysis.prunable_fraction(curve_ablation, config.prune_tolerance, metric),
        analysis_s=time.perf_counter() - analysis_start)
    metrics = _record_machine({**result, **summary}, config, device)

    details = dict(
        task=task.config(), n_layers=config.model.n_layers, n_heads=n_heads, d_model=config.model.d_model,
        head_dim=model.head_dim, classes=classes, scores=[{k: v.tolist() for k, v in s.items()} for s in scores],
        induction_periods=periods, induction_by_period=induction_by_period.tolist(),
        js=js.tolist(), overlap={n: m.tolist() for n, m in overlap.items()},
        overlap_init={n: m.tolist() for n, m in overlap_init.items()},
        max_cos={n: m.tolist() for n, m in max_cos.items()},
        classes_selective=classes_selective, importance=importance.tolist(), importance_raw=importance_raw.tolist(),
        derivative=derivative.tolist(), prune_metric=metric,
        ablation={k: None if v is None else v.tolist() for k, v in ablation.items()},
        prune_importance=curve_importance, prune_random=curves_random, prune_raw=curve_raw,
        prune_ablation=curve_ablation, example_tokens=x_scores[0].tolist(),
        example_text=task.decode(x_scores[0]) if hasattr(task, "decode") else None)
    if out_dir is not None:
        save_json(details, artifacts_path / "analysis.json")
        mean_maps = np.stack([w.mean(axis=0) for w in weights])  # (n_layers, h, L, L): mean over the batch
        example = np.stack([w[0] for w in weights])  # (n_layers, h, L, L): the first analysis sequence
        np.savez_compressed(artifacts_path / "attention.npz", example=example.astype(np.float16),
                            mean=mean_maps.astype(np.float16), tokens=x_scores[0].cpu().numpy())
    _finish(metrics, out_dir, {}, None)
    return dict(metrics=metrics, model=model, task=task, details=details, weights=weights,
                curves=dict(importance=curve_importance, random=curves_random))


# ------------------------------------------------------------------------------------------------ dynamics
def _dynamics_task(config: DynamicsRun):
    """The task; the plain induction task scores every position here (the first copy is the control)."""
    from mha.experiments.tasks import make_task

    kwargs = dict(config.task_kwargs)
    if config.task == "induction":
        kwargs = {"score": "all", **kwargs}
    task = make_task(config.task, seed=config.train.seed, **kwargs)
    if isinstance(task, RepeatedSequence) and task.score != "all":
        raise ValueError("the induction task must score every position (task_kwargs score='all', the default here)")
    return task


def _repeat_mask_fn(task):
    """x -> (N, L) bool "on the repeat" for a repeat task (fixed period: t >= seq_len; varying: from the tokens)."""
    if hasattr(task, "repeat_mask"):
        return task.repeat_mask
    seq_len = task.seq_len
    return lambda x: (torch.arange(x.shape[1], device=x.device)[None, :] >= seq_len).expand(x.shape[0], -1)


def run_dynamics(config: DynamicsRun, out_dir=None, artifacts_dir=None) -> dict:
    """Train while recording the dynamics (:class:`mha.experiments.probes.DynamicsProbe`), then summarise them.

    Book: part III, "Induction heads" (repeat tasks: the loss on each half, induction scores, head ablations,
    attention maps) and "The scaling ablation" (gradient norms, loss spikes, score statistics at initialisation
    and after training). Returns {"metrics", "model", "task", "history", "grad_norms", "q_grad_norms",
    "k_grad_norms", "step_losses", "artifacts"}.

    Besides the global gradient norm, every step's W_Q and W_K gradient norms per layer (before clipping), summarised
    as ``q_grad_norm_median_L{i}``, ``q_grad_norm_max_L{i}``, ``k_grad_norm_median_L{i}``, ``k_grad_norm_max_L{i}``.
    On a repeat task, the head ablations (:func:`~mha.experiments.probes.head_ablations`, zero and mean) include the
    heads identified at the end of training as induction heads and as previous-token heads (:func:`_identified_heads`):
    ``n_induction_heads``, ``n_previous_token_heads``, ``loss_repeat_probe_mean_ablate_induction``,
    ``loss_repeat_probe_mean_ablate_prev`` and their zero-ablation counterparts (None when no head was identified),
    and ``loss_repeat_probe_mean_ablate_layer0`` beside ``loss_repeat_probe_no_layer0``.
    """
    out_dir, artifacts_path = _prepare(config, DynamicsRun, out_dir, artifacts_dir)
    task = _dynamics_task(config)
    is_repeat = isinstance(task, RepeatedSequence)
    device = torch.device("cpu")
    probe_x = None
    if is_repeat:
        from mha.experiments.machine import resolve_device

        device = resolve_device(config.train.device)
        probe_x = fixed_period_probe(task, config.train.seed + 1000, 64, device)[0]  # (64, 2 seq_len - 1)
    probe = DynamicsProbe(repeat_mask=_repeat_mask_fn(task) if is_repeat else None, probe_x=probe_x,
                          period=task.seq_len if is_repeat else None)
    model_config = config.model_config(task)
    try:
        result = train(model_config, task, config.train, progress=config.progress, hooks=[probe])
    finally:
        probe.close()  # the W_Q / W_K gradient hooks: the model returned carries none
    model = result.model
    device = next(model.parameters()).device
    history = result["history"]

    warmup = config.train.warmup_steps
    grad_norms = probe.grad_norms
    after_warmup = _after_warmup(grad_norms, warmup)
    spikes = count_spikes(probe.step_losses, warmup, config.spike_window, config.spike_sigmas)
    final, init = history[-1], history[0]
    ablations, identified = [], {}
    if is_repeat:  # the same 64 fixed-period sequences as the induction probe
        identified = _identified_heads(final)
        ablation_x, ablation_y = fixed_period_probe(task, config.train.seed + 1000, 64, device)
        ablations = head_ablations(model, ablation_x, ablation_y, task.seq_len, head_sets=identified)

    metrics = dict(
        val_loss=final["val_loss"], val_acc=final["val_acc"], train_loss=final["train_loss"],
        val_loss_best=min(h["val_loss"] for h in history), finite=probe.finite, steps_done=len(probe.step_losses),
        max_grad_norm=float(after_warmup.max()), median_grad_norm=float(np.median(after_warmup)),
        clipped_fraction=(float(np.mean(np.array(grad_norms) > config.train.grad_clip)) if config.train.grad_clip > 0
                          else 0.0),
        loss_spikes=spikes, tokens_per_s=result["tokens_per_s"], wall_s=result["wall_s"],
        params=result["params"], n_kv_heads=result["n_kv_heads"], head_dim=result["head_dim"],
        kv_cache_bytes=result["kv_cache_bytes"], model_config=result["model_config"],
        train_config=result["train_config"], task_config=task.config())
    metrics.update(_qk_grad_summary(probe, warmup))
    for when, record in (("init", init), ("final", final)):
        for stat in ("score_std", "score_absmax", "score_var_pred", "entropy", "max_weight"):
            metrics[f"{stat}_{when}"] = max(layer[stat] for layer in record["layers"])  # largest over the layers
    if is_repeat:
        for key in ("loss_first", "loss_repeat", "acc_first", "acc_repeat"):
            metrics[key] = final[key]
        metrics["induction_max"] = max(max(layer["induction"]) for layer in final["layers"])
        metrics["previous_token_max"] = max(max(layer["previous_token"]) for layer in final["layers"])

    artifacts = {"history": rounded(history)}
    if ablations:
        artifacts["ablations"] = rounded(ablations)
        metrics["loss_repeat_probe"] = ablations[0]["loss_repeat"]
        metrics["loss_repeat_probe_no_layer0"] = next(a["loss_repeat"] for a in ablations if a["ablated"] == "L0")
        by_name = {a["ablated"]: a["loss_repeat"] for a in ablations}
        metrics["loss_repeat_probe_mean_ablate_layer0"] = by_name["mean:L0"]
        for name, short in (("induction", "induction"), ("previous_token", "prev")):
            metrics[f"n_{name}_heads"] = len(identified[name])
            # None when no head passed the threshold (nothing to ablate)
            metrics[f"loss_repeat_probe_zero_ablate_{short}"] = by_name.get(name)
            metrics[f"loss_repeat_probe_mean_ablate_{short}"] = by_name.get(f"mean:{name}")
    if config.save_attention and is_repeat:
        artifacts["attention"] = _saved_attention(model, task, final, config.train.seed)
    _record_machine(metrics, config, device)
    _finish(metrics, out_dir, artifacts, artifacts_path)
    return dict(metrics=metrics, model=model, task=task, history=history, grad_norms=grad_norms,
                q_grad_norms=probe.q_grad_norms, k_grad_norms=probe.k_grad_norms, step_losses=probe.step_losses,
                artifacts=artifacts)


def _after_warmup(per_step, warmup: int) -> np.ndarray:
    """The steps after warmup of a per-step record (a list of numbers, or of one number per layer), as a float array;
    all of them if the run stopped before warmup ended."""
    values = np.array(per_step, dtype=float)
    return values[warmup:] if len(values) > warmup else values


def _qk_grad_summary(probe: DynamicsProbe, warmup: int) -> dict:
    """Per layer i: q_grad_norm_median_L{i}, q_grad_norm_max_L{i}, k_grad_norm_median_L{i}, k_grad_norm_max_L{i},
    the median and the largest gradient norm of W_Q and W_K (before clipping) over the steps after warmup (all steps
    if the run stopped before warmup ended), as median_grad_norm and max_grad_norm."""
    summary = {}
    for kind, norms in (("q", probe.q_grad_norms), ("k", probe.k_grad_norms)):
        after_warmup = _after_warmup(norms, warmup)  # (steps, n_layers)
        for layer in range(after_warmup.shape[1]):
            summary[f"{kind}_grad_norm_median_L{layer}"] = float(np.median(after_warmup[:, layer]))
            summary[f"{kind}_grad_norm_max_L{layer}"] = float(after_warmup[:, layer].max())
    return summary


def _identified_heads(final: dict) -> dict:
    """{"induction": [(layer, head), ...], "previous_token": [...]}: the heads whose final induction (previous-token)
    score on the fixed-period probe passes :data:`mha.experiments.analysis.THRESHOLDS` (score >= 0.5). The two are
    tested independently, not in :func:`~mha.experiments.analysis.classify_heads`'s order: the scores average over
    different queries (the repeat; every position), so a head could in principle be in both sets."""
    return {kind: [(layer, head) for layer, record in enumerate(final["layers"])
                   for head, score in enumerate(record[kind]) if score >= analysis.THRESHOLDS[kind]]
            for kind in ("induction", "previous_token")}


@torch.no_grad()
def _saved_attention(model: TinyTransformer, task, final: dict, seed: int) -> dict:
    """One repeated probe sequence with the shortest period (the smallest map that shows the repeat), and per layer
    the heads with the highest induction and previous-token scores at the end of training."""
    min_period = getattr(task, "min_period", task.seq_len)
    device = next(model.parameters()).device
    figure_task = RepeatedSequence(vocab_size=task.vocab_size, seq_len=min_period, score="all", seed=seed + 2000)
    figure_x = figure_task.get_batch("val", 1, device)[0]  # (1, 2 min_period - 1)
    figure_weights = model.eval()(figure_x, need_weights=True)[2]  # n_layers x (1, h, L, L)
    heads = []
    for layer, (record, w) in enumerate(zip(final["layers"], figure_weights)):
        for score in ("induction", "previous_token"):
            head = int(np.argmax(record[score]))
            if not any(h["layer"] == layer and h["head"] == head for h in heads):
                heads.append(dict(layer=layer, head=head, chosen_by=score, induction=record["induction"][head],
                                  previous_token=record["previous_token"][head],
                                  weights=np.round(w[0, head].cpu().numpy(), 2).tolist()))
    return dict(tokens=figure_x[0].tolist(), period=min_period, heads=heads)


# ----------------------------------------------------------------------------------------------- shakespeare
def run_shakespeare(config: ShakespeareRun, out_dir=None, artifacts_dir=None) -> dict:
    """nanoGPT's character model: train, measure the loss on ``final_eval_batches`` fresh batches of each split (with
    its standard error), and sample text (greedy, and at ``sample_temperature`` with top-k). With
    ``sink_probe_batches``, then measure each head's attention to the first token and its sink logit's share on that
    many fresh held-out batches (:func:`~mha.experiments.probes.first_token_attention`; artifact ``sinks.json``).

    Book: part III, "A nanoGPT-comparable character model"; part IV, "Windows and sinks, measured" (the attention
    options of :class:`~mha.experiments.config.ModernModelConfig`). ``train_wall_s`` is the trainer's wall time (model
    construction, steps and periodic evaluations, as nanoGPT's timing); ``total_wall_s`` adds loading the text.
    Returns {"metrics", "model", "task", "samples"}.
    """
    total_start = time.perf_counter()
    out_dir, artifacts_path = _prepare(config, ShakespeareRun, out_dir, artifacts_dir)
    task = config.make_task()
    result = train(config.model_config(task), task, config.train, progress=config.progress)
    total_wall_s = time.perf_counter() - total_start
    model = result.model.eval()
    device = next(model.parameters()).device

    generator = torch.Generator().manual_seed(config.train.seed)
    final = {}
    for split in ("train", "val"):
        batches = [task.get_batch(split, config.train.batch_size, device) for _ in range(config.final_eval_batches)]
        per_batch = torch.tensor([evaluate(model, [batch], False)[0] for batch in batches])
        final[split] = (per_batch.mean().item(), (per_batch.std() / config.final_eval_batches ** 0.5).item())
    prompt = torch.tensor([task.encode("\n")], device=device)  # nanoGPT's sample.py starts from "\n"
    samples = {
        "greedy": task.decode(model.generate(prompt, config.sample_chars, greedy=True)[0, 1:]),
        "sampled": task.decode(model.generate(prompt, config.sample_chars, temperature=config.sample_temperature,
                                              top_k=min(config.sample_top_k, task.vocab_size),
                                              generator=generator)[0, 1:]),
    }
    metrics = dict(result)
    metrics.update(
        train_wall_s=result["wall_s"], total_wall_s=total_wall_s,
        val_loss_final=final["val"][0], val_loss_final_se=final["val"][1],
        train_loss_final=final["train"][0], train_loss_final_se=final["train"][1], **machine_load())
    _record_machine(metrics, config, device)
    artifacts = {"samples": dict(history=metrics["history"], prompt="\n", temperature=config.sample_temperature,
                                 top_k=config.sample_top_k, **samples)}
    if config.sink_probe_batches:  # after everything above: the batches it draws change nothing measured before
        probe_batches = [task.get_batch("val", config.train.batch_size, device)
                         for _ in range(config.sink_probe_batches)]
        sinks = first_token_attention(model, probe_batches)
        artifacts["sinks"] = sinks
        first_token = np.array(sinks["first_token"])  # (n_layers, h)
        metrics.update(first_token_mass_mean=float(first_token.mean()), first_token_mass_max=float(first_token.max()),
                       sink_probability_mean=None if sinks["sink"] is None else float(np.mean(sinks["sink"])))
    _finish(metrics, out_dir, artifacts, artifacts_path, compact=False)
    return dict(metrics=metrics, model=model, task=task, samples=samples)


@dataclass(frozen=True)
class Study:
    """A study: its configuration class (:mod:`mha.experiments.config`) and its function. Its name is the
    configuration's ``study``; its papermill template is ``experiments/notebooks/<name>.ipynb``."""

    config: type[RunConfig]  # its settings (the names a sweep file may set) and their defaults
    function: Callable[..., dict]  # function(config, out_dir=None, artifacts_dir=None) -> {"metrics": ..., ...}

    @property
    def name(self) -> str:
        return self.config.study


STUDIES = {study.name: study for study in (Study(TrainRun, run_train), Study(HeadsRun, run_heads),
                                            Study(DynamicsRun, run_dynamics), Study(ShakespeareRun, run_shakespeare))}
"""The studies, by name: the one registry (sweep files name a study; ``--executor function`` runs its function)."""


def make_config(study: str, values: dict) -> RunConfig:
    """The configuration of ``study`` ('train', 'heads', 'dynamics', 'shakespeare') from flat ``values`` (a sweep's
    names), checked: :meth:`RunConfig.from_dict <mha.experiments.config.RunConfig.from_dict>` of its class."""
    check_choice("study", study, sorted(STUDIES))
    return STUDIES[study].config.from_dict(values)


def run_config(config: RunConfig, out_dir=None, artifacts_dir=None) -> dict:
    """Run the study ``config`` is for (``config.study``); return everything its function returns ("metrics", and
    what its notebook plots). The papermill templates and ``--executor function`` both run a run through here."""
    check_type("config", config, RunConfig, "a study's configuration (see make_config)")
    check_choice("config.study", config.study, sorted(STUDIES))
    return STUDIES[config.study].function(config, out_dir=out_dir, artifacts_dir=artifacts_dir)


def run_study(study: str, parameters: dict, out_dir=None, artifacts_dir=None) -> dict:
    """Run ``study`` with flat ``parameters`` (a sweep's names); return its metrics."""
    return run_config(make_config(study, parameters), out_dir=out_dir, artifacts_dir=artifacts_dir)["metrics"]
