"""AEA calibration: what `moe-embed calibrate-aea` (`convert/calibrate_aea.py`) runs. The model is loaded with
eager attention, the homogeneity of every MoE layer measured on the calibration texts, the per-layer expert
counts chosen (by the options, or by the best Spearman correlation on the STS-B dev pairs with `--search`)
and the folder written with `aea_config.json` and the Sentence-Transformers module that applies it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from moe_embed.convert.cards import PLACEHOLDER_OWNER, render_aea_card
from moe_embed.convert.folder_writer import write_model_folder
from moe_embed.errors import UsageError
from moe_embed.files import atomic_output_dir, read_json, write_json
from moe_embed.modeling.defaults import TASK_TYPE_EXPERTS, prompt_key
from moe_embed.modeling.manifest import ST_MODULES
from moe_embed.modeling.st_folder import PORTABLE_MODULES

if TYPE_CHECKING:
    from moe_embed.convert.options import CalibrateOptions

logger = logging.getLogger(__name__)

PROMPT_EOL = 'This sentence : "[TEXT]" means in one word:"'


def load_model(source: Path):
    """`(model, tokenizer)` of a supported MoE folder, with eager attention (token-wise allocation reads
    attention probabilities) and eval mode."""
    from transformers import AutoModel, AutoTokenizer

    from moe_embed.modeling.aea_layers import find_moe_layers

    try:
        model = AutoModel.from_pretrained(str(source), trust_remote_code=True, attn_implementation="eager")
    except (OSError, ValueError, KeyError) as error:
        raise UsageError(f"cannot load a model from {source}: {str(error).splitlines()[0]}") from None
    try:
        find_moe_layers(model)
    except ValueError as error:
        raise UsageError(str(error)) from None
    tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def default_template(source: Path, causal: bool) -> str:
    """PromptEOL for decoders; for encoders the source's prompt of the task that serves STS (`TASK_TYPE_EXPERTS`:
    classification, the prompt evaluation uses for similarity) in front of the text, or the bare text."""
    if causal:
        return PROMPT_EOL
    st_config = source / "config_sentence_transformers.json"
    prompts = (read_json(st_config).get("prompts") or {}) if st_config.is_file() else {}
    return prompts.get(prompt_key(TASK_TYPE_EXPERTS["sts"]), "") + "[TEXT]"


def sts_dev(data: str | None):
    """The STS-B dev pairs (mteb/stsbenchmark-sts, validation; the data folder's copy, else the Hub):
    `(sentences1, sentences2, scores)`."""
    from moe_embed.data import data_dir, load

    rows = load("mteb/stsbenchmark-sts", None, "validation", folder=data_dir(data), purpose="AEA calibration")
    return list(rows["sentence1"]), list(rows["sentence2"]), [float(score) for score in rows["score"]]


def batches(tokenizer, texts: list[str], template: str, batch_size: int, max_length: int):
    """`(input_ids, attention_mask)` batches of the templated texts, in order."""
    for start in range(0, len(texts), batch_size):
        chunk = [template.replace("[TEXT]", text) for text in texts[start : start + batch_size]]
        encoded = tokenizer(chunk, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        yield encoded["input_ids"], encoded["attention_mask"]


@torch.no_grad()
def embed_kinds(controller, tokenizer, texts, template, pooling, kinds, batch_size=64, max_length=256) -> dict:
    """`{kind: sentence embeddings of texts}` for each embedding kind of `kinds`, from one forward pass
    with the allocation of `controller` (as the saved folder computes them), in the order of `texts`;
    batches hold texts of similar length (each text's embedding does not depend on its batch)."""
    from moe_embed.modeling.aea_pooling import sentence_embedding

    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # longest first, as Sentence-Transformers
    out = {kind: [] for kind in kinds}
    with controller.apply():
        for input_ids, attention_mask in batches(
            tokenizer, [texts[i] for i in order], template, batch_size, max_length
        ):
            output = controller(input_ids, attention_mask, output_routing_probs=set(kinds) != {"hidden"})
            for kind in kinds:
                out[kind].append(sentence_embedding(output, attention_mask, pooling, kind))
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return {kind: torch.cat(parts)[inverse] for kind, parts in out.items()}


def embed(controller, tokenizer, texts, template, pooling, embedding, batch_size=64, max_length=256) -> torch.Tensor:
    """Sentence embeddings of `texts` of one embedding kind (see `embed_kinds`)."""
    return embed_kinds(controller, tokenizer, texts, template, pooling, [embedding], batch_size, max_length)[embedding]


def layer_allocation(allocation, homogeneity, layers, alpha, shift, exit_layer):
    """`(layer_top_k, unspent)` for an `--allocation` mode: the homogeneity rule for `both` / `layer`,
    the model's own k up to the exit layer otherwise."""
    from moe_embed.modeling.aea_allocation import allocate_layers

    top_k = next(h.router.top_k for h in layers if h.router is not None)
    if allocation in ("both", "layer"):
        caps = [h.cap if h.router is not None else None for h in layers]
        try:
            return allocate_layers(homogeneity, top_k, caps, alpha=alpha, shift=shift, exit_layer=exit_layer)
        except ValueError as error:
            raise UsageError(str(error)) from None
    return [None if h.router is None else (h.router.top_k if i < exit_layer else 0) for i, h in enumerate(layers)], 0


def controller_for(model, settings):
    """The `AdaptiveExpertAllocation` of `settings` (an `aea_config.json` dict) on `model`."""
    from moe_embed.modeling.aea_controller import AdaptiveExpertAllocation

    return AdaptiveExpertAllocation(
        model,
        layer_top_k=settings["layer_top_k"],
        token_wise=settings["token_wise"],
        rounding=settings["rounding"],
        exit_layer=settings["exit_layer"],
    )


def pair_spearman(embeddings: torch.Tensor, index: dict, pairs) -> float:
    """Spearman correlation (x100) of the cosine similarities of `pairs` (sentences1, sentences2, scores),
    each sentence's embedding the row `index[sentence]` of `embeddings`."""
    from scipy.stats import spearmanr

    sentences1, sentences2, scores = pairs
    first = embeddings[[index[s] for s in sentences1]]
    second = embeddings[[index[s] for s in sentences2]]
    cosines = torch.nn.functional.cosine_similarity(first, second).numpy()
    return 100 * float(spearmanr(cosines, scores).statistic)


def spearman(model, tokenizer, pairs, settings) -> float:
    """Spearman correlation (x100) of the cosine similarities on `pairs` under `settings`."""
    texts = list(dict.fromkeys(pairs[0] + pairs[1]))
    args = (settings["prompt_template"], settings["pooling"], settings["embedding"])
    embeddings = embed(controller_for(model, settings), tokenizer, texts, *args)
    return pair_spearman(embeddings, {text: i for i, text in enumerate(texts)}, pairs)


def pick(scores: dict) -> tuple:
    """The best `(alpha, exit_layer)` of a search; ties go to the smaller α, then to the later exit."""
    return max(scores, key=lambda key: (scores[key], -key[0], key[1]))


def print_table(homogeneity, original, layer_top_k) -> None:
    print("layer  homogeneity  k (model)  k (AEA)")
    for index, (s, k0, k) in enumerate(zip(homogeneity, original, layer_top_k, strict=True)):
        if s is None:
            print(f"{index:>5}  {'dense':>11}  {'-':>9}  {'-':>7}")
        else:
            print(f"{index:>5}  {s:>11.4f}  {k0:>9}  {k:>7}")


def plot(path: Path, homogeneity, layer_top_k, title: str) -> None:
    """Bar charts of the homogeneity and of the expert count per layer (paper Figures 2 and 6), when
    matplotlib (the `analysis` extra) is installed."""
    try:
        import matplotlib
    except ImportError:
        logger.info("matplotlib is not installed (pip install moe-embed[analysis]): no allocation chart")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [i for i, s in enumerate(homogeneity) if s is not None]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(max(5, 0.4 * len(layers) + 2), 5), sharex=True)
    top.bar(layers, [homogeneity[i] for i in layers], color="tab:blue")
    top.set_ylabel("homogeneity")
    top.set_title(title)
    bottom.bar(layers, [layer_top_k[i] for i in layers], color="tab:orange")
    bottom.set_ylabel("experts per token")
    bottom.set_xlabel("layer")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_folder(target: Path, model, tokenizer, settings: dict, source_name: str, repo_id: str) -> None:
    """Model weights, tokenizer, `aea_config.json`, the Sentence-Transformers module files and the card."""
    write_json(target / "aea_config.json", settings)
    write_model_folder(
        target,
        model=model,
        code="aea",
        tokenizer=tokenizer,
        input_module=ST_MODULES["aea"],
        # normalised, as every other folder's embeddings are (cosine scores are unchanged; a dot product becomes one)
        following_modules=[{"path": "1_Normalize", "type": PORTABLE_MODULES["Normalize"]}],
        module_settings={"transformer_task": "feature-extraction"},
        card=lambda folder: render_aea_card(folder, settings, source_name, repo_id),
    )


def search_candidates(options: CalibrateOptions, layers, num_layers: int) -> list[tuple[float, int]]:
    """The `(alpha, exit_layer)` pairs `--search` scores."""
    alphas = options.alphas if options.allocation in ("both", "layer") else [options.alpha]
    exits = options.exit_layers or [m for m in range(num_layers - 3, num_layers + 1) if m >= 1]
    for m in exits:
        if not 1 <= m <= num_layers:
            raise UsageError(f"--exit-layers: {m} is outside 1..{num_layers}")
    return [(alpha, m) for alpha in alphas for m in exits if any(h.router is not None for h in layers[:m])]


def choose_allocation(options: CalibrateOptions, model, tokenizer, layers, homogeneity, dev, settings: dict) -> dict:
    """The AEA settings with their per-layer expert counts: the options' own, or the best on STS-B dev of the
    `--search` grid. Every candidate's allocation is computed (and refused, in one line) before the
    first one is scored, so a grid the homogeneity rules out fails at once, not after the search."""

    def with_allocation(alpha, exit_at):
        layer_top_k, unspent = layer_allocation(options.allocation, homogeneity, layers, alpha, options.shift, exit_at)
        return {**settings, "alpha": alpha, "exit_layer": exit_at, "layer_top_k": layer_top_k}, unspent

    if not options.search:
        chosen, unspent = with_allocation(options.alpha, settings["exit_layer"])
        return {**chosen, "unspent_budget": unspent}
    candidates = {key: with_allocation(*key)[0] for key in search_candidates(options, layers, len(layers))}
    scores, seen = {}, {}
    for (alpha, m), candidate in tqdm(candidates.items(), desc="search (STS-B dev)", unit="setting"):
        key = (tuple(candidate["layer_top_k"]), m)  # α values that give the same allocation are scored once
        if key not in seen:
            seen[key] = spearman(model, tokenizer, dev, candidate)
        scores[(alpha, m)] = seen[key]
        tqdm.write(f"search: alpha {alpha:g}, exit layer {m}: STS-B dev Spearman {scores[(alpha, m)]:.2f}")
    best = pick(scores)
    print(f"search: chose alpha {best[0]:g}, exit layer {best[1]} ({scores[best]:.2f} on STS-B dev)")
    chosen, unspent = with_allocation(*best)
    search = {f"alpha={a:g},exit={m}": round(score, 4) for (a, m), score in scores.items()}
    return {**chosen, "unspent_budget": unspent, "search": search}


def run_calibration(options: CalibrateOptions, folder, output: Path, texts: list[str] | None, dev) -> Path:
    """Measure the homogeneity of the opened MoE `folder` on `texts` (default: the STS-B dev sentences of
    `dev`), choose the allocation and write the AEA folder to `output`."""
    from moe_embed.modeling.aea_homogeneity import measure_homogeneity
    from moe_embed.modeling.aea_layers import find_moe_layers

    if texts is None:
        texts = list(dict.fromkeys(dev[0] + dev[1]))  # the STS-B dev sentences, each once
    model, tokenizer = load_model(folder.path)
    _, layers = find_moe_layers(model)
    num_layers = len(layers)
    causal = bool(getattr(layers[0].attention, "is_causal", False))
    exit_layer = options.exit_layer if options.exit_layer is not None else (num_layers - 1 if causal else num_layers)
    if not 1 <= exit_layer <= num_layers:
        raise UsageError(f"--exit-layer must lie in 1..{num_layers} (the model's layers), got {exit_layer}")
    if not any(h.router is not None for h in layers[:exit_layer]):
        raise UsageError(f"no MoE layer among the first {exit_layer} layers; choose a later --exit-layer")
    if len({h.router.top_k for h in layers if h.router is not None}) > 1:
        raise UsageError("the model's MoE layers use different top-k; AEA's budget assumes one k for all")
    template = options.prompt if options.prompt is not None else default_template(folder.path, causal)
    if options.search:
        search_candidates(options, layers, num_layers)  # bad grids are refused before the long pass below

    batched = batches(tokenizer, texts, template, options.batch_size, options.max_length)
    total = -(-len(texts) // options.batch_size)
    homogeneity = measure_homogeneity(model, tqdm(batched, total=total, desc="expert homogeneity", unit="batch"))
    settings = {
        "allocation": options.allocation,
        "token_wise": options.allocation in ("both", "token"),
        "rounding": options.rounding,
        "alpha": options.alpha,
        "shift": options.shift,
        "exit_layer": exit_layer,
        "prompt_template": template,
        "pooling": options.pooling or ("last" if causal else "mean"),
        "embedding": options.embedding,
    }
    settings = choose_allocation(options, model, tokenizer, layers, homogeneity, dev, settings)
    model_top_k = [h.router.top_k if h.router is not None else None for h in layers]
    settings.update(
        homogeneity=homogeneity,
        model_top_k=model_top_k,
        calibration=options.calibration or "STS-B dev sentences",
        calibration_texts=len(texts),
    )
    print_table(homogeneity, model_top_k, settings["layer_top_k"])
    if settings["unspent_budget"]:
        print(f"every kept layer is at its cap: {settings['unspent_budget']} of the budget's expert slots stay unspent")

    with atomic_output_dir(output, options.overwrite) as target:
        write_folder(target, model, tokenizer, settings, options.model, f"{PLACEHOLDER_OWNER}/{output.name}")
        plot(target / "aea_allocation.png", homogeneity, settings["layer_top_k"], f"AEA allocation of {options.model}")
    print(f"wrote {output}")
    return output
