"""Route inputs to MoTE experts with plain transformers: by instruction prefix, or with task=.

python examples/route_with_automodel.py models/mote-minilm
"""

import argparse

import torch
from transformers import AutoModel, AutoTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="models/mote-minilm", help="MoTE model folder or Hub id")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    model = AutoModel.from_pretrained(args.model, trust_remote_code=True).eval()
    print("tasks and prefixes:", model.config.task_prefixes)

    # 1. The prefix each text starts with picks the expert, row by row, in one batch.
    texts = ["search_query: who was isaac newton?", "clustering: stocks fell on wall street"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    print("routed by prefix:", [model.config.tasks[i] for i in out.task_ids.tolist()])

    # 2. Name the task explicitly: one for the batch, or one per row (aliases such as "passage" work).
    plain = tokenizer(["isaac newton", "stock markets"], padding=True, return_tensors="pt")
    with torch.no_grad():
        one = model(**plain, task="classification")
        per_row = model(**plain, task=["query", "passage"])
    print("task='classification':", [model.config.tasks[i] for i in one.task_ids.tolist()])
    print("task=['query', 'passage']:", [model.config.tasks[i] for i in per_row.task_ids.tolist()])
    print(
        "last_hidden_state:",
        tuple(per_row.last_hidden_state.shape),
        "pooler_output:",
        tuple(per_row.pooler_output.shape),
    )

    # 3. Without a task or a prefix: the folder's default task (`config.default_task`; upcycled folders use
    # classification unless built with --strict-routing, which makes such inputs an error).
    try:
        with torch.no_grad():
            default = model(**plain)
        print(
            f"no task: default task {model.config.default_task!r}:", [model.config.tasks[i] for i in default.task_ids]
        )
    except ValueError as error:
        print("no task:", str(error)[:100], "...")


if __name__ == "__main__":
    main()
