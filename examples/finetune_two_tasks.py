"""Fine-tune a MoTE model on two tasks with SentenceTransformerTrainer: each dataset trains its
own experts (retrieval pairs -> query/document experts, paraphrase pairs -> clustering expert).

    python examples/finetune_two_tasks.py models/mote-minilm --output models/mote-finetuned
"""

import argparse

from datasets import Dataset, DatasetDict
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.losses import MultipleNegativesRankingLoss

RETRIEVAL = [
    ("what do cats eat", "Cats are obligate carnivores and eat meat."),
    ("capital of france", "Paris is the capital of France."),
    ("how tall is everest", "Mount Everest is 8,849 metres tall."),
    ("who wrote hamlet", "Hamlet is a tragedy by William Shakespeare."),
    ("boiling point of water", "Water boils at 100 degrees Celsius at sea level."),
    ("largest planet", "Jupiter is the largest planet in the Solar System."),
    ("speed of light", "Light travels at about 300,000 km per second."),
    ("inventor of the telephone", "Alexander Graham Bell patented the telephone."),
]
CLUSTERING = [
    ("stock markets fell sharply", "shares dropped on wall street"),
    ("the team won the final", "a late goal decided the championship"),
    ("new vaccine approved", "regulators cleared the vaccine"),
    ("storm hits the coast", "hurricane makes landfall"),
    ("election results announced", "votes counted in the national poll"),
    ("phone maker unveils device", "company launches new smartphone"),
    ("rain expected tomorrow", "forecast calls for showers"),
    ("museum opens new wing", "gallery expands exhibition space"),
]


def to_dataset(pairs):
    return Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="models/mote-minilm", help="MoTE model folder or Hub id")
    parser.add_argument("--output", default="models/mote-finetuned", help="where to save the fine-tuned model")
    parser.add_argument("--steps", type=int, default=4, help="training steps")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args()

    model = SentenceTransformer(args.model, trust_remote_code=True)
    train = DatasetDict({"retrieval": to_dataset(RETRIEVAL), "clustering": to_dataset(CLUSTERING)})
    training_args = SentenceTransformerTrainingArguments(
        output_dir=args.output,
        per_device_train_batch_size=4,
        max_steps=args.steps,
        learning_rate=2e-5,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        # One prompt per dataset and column: the prefix also routes each row to its expert.
        prompts={
            "retrieval": {"anchor": model.prompts["query"], "positive": model.prompts["document"]},
            "clustering": model.prompts["Clustering"],
        },
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=training_args, train_dataset=train, loss=MultipleNegativesRankingLoss(model)
    )
    trainer.train()
    model.save(args.output)
    print(f"saved the fine-tuned model to {args.output}")
    reloaded = SentenceTransformer(args.output, trust_remote_code=True)
    print("reloaded; query embedding shape:", reloaded.encode_query(["capital of france"]).shape)


if __name__ == "__main__":
    main()
