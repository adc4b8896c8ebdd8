"""Load a MoTE model folder with transformers and with Sentence-Transformers, embed one text under
every task, and print the embeddings and their inter-task cosine similarities.

    moe-embed upcycle --output models/mote-minilm
    python examples/quickstart.py models/mote-minilm
"""

import argparse

import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer


def mean_pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the token vectors that are not padding."""
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    return (last_hidden_state * mask).sum(1) / mask.sum(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="models/mote-minilm", help="MoTE model folder or Hub id")
    parser.add_argument(
        "--text",
        default="Isaac Newton formulated the laws of motion and universal gravitation.",
        help="text to embed under every task",
    )
    args = parser.parse_args()

    # 1. transformers: the expert is read from the instruction prefix, or named with task=.
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    model = AutoModel.from_pretrained(args.model, trust_remote_code=True).eval()
    tasks = model.config.tasks
    prefixed = [model.config.task_prefixes[t] + args.text for t in tasks]
    batch = tokenizer(prefixed, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)  # one batch, four tasks: routed row by row from the prefixes
    routed = [tasks[i] for i in out.task_ids.tolist()]
    print(f"AutoModel routed the prefixed rows to experts: {routed}")
    hf_embeddings = torch.nn.functional.normalize(mean_pool(out.last_hidden_state, batch["attention_mask"]), dim=-1)

    # 2. Sentence-Transformers: a prompt (the task's prefix) picks the expert, as the prefix in the text does.
    st = SentenceTransformer(args.model, trust_remote_code=True)
    prompts = [model.config.task_prefixes[t] for t in tasks]
    st_embeddings = torch.stack([st.encode(args.text, prompt=p, convert_to_tensor=True) for p in prompts])
    agree = (st_embeddings - hf_embeddings).abs().max().item()
    print(f"SentenceTransformer and AutoModel + mean pooling agree to {agree:.1e}\n")

    print(f"text: {args.text!r}")
    for task, vector in zip(tasks, st_embeddings, strict=True):
        head = ", ".join(f"{x:+.4f}" for x in vector[:6].tolist())
        print(f"  {task:<15} prompt {model.config.task_prefixes[task]!r:<22} [{head}, ...] (dim {vector.numel()})")

    similarity = st.similarity(st_embeddings, st_embeddings)
    print("\ninter-task cosine similarity of the same text:")
    print(" " * 16 + "".join(f"{t[:12]:>14}" for t in tasks))
    for task, row in zip(tasks, similarity.tolist(), strict=True):
        print(f"  {task:<14}" + "".join(f"{v:>14.4f}" for v in row))

    query = st.encode_query(["who discovered gravity?"])
    docs = st.encode_document([args.text, "The Eiffel Tower is in Paris."])
    print(f"\nencode_query / encode_document similarity: {st.similarity(query, docs).tolist()[0]}")


if __name__ == "__main__":
    main()
