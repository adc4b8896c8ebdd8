"""Encode with Sentence-Transformers: prompts, encode_query/encode_document and a small search.

python examples/semantic_search.py models/mote-minilm
"""

import argparse

from sentence_transformers import SentenceTransformer

DOCUMENTS = [
    "Isaac Newton formulated the laws of motion and universal gravitation.",
    "The Great Wall of China is over 21,000 kilometres long.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "Marie Curie was the first person to win Nobel Prizes in two sciences.",
    "The Pacific is the largest and deepest of Earth's oceans.",
]
QUERIES = ["who discovered gravity?", "how do plants make energy?", "biggest ocean"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="models/mote-minilm", help="MoTE model folder or Hub id")
    args = parser.parse_args()

    model = SentenceTransformer(args.model, trust_remote_code=True)
    print("prompts:", model.prompts)

    # encode_query / encode_document use the "query" and "document" prompts and experts.
    query_embeddings = model.encode_query(QUERIES)
    document_embeddings = model.encode_document(DOCUMENTS)
    scores = model.similarity(query_embeddings, document_embeddings)
    for query, row in zip(QUERIES, scores, strict=True):
        best = int(row.argmax())
        print(f"{query!r:32} -> {DOCUMENTS[best]!r} ({row[best]:.3f})")

    # Any prompt name picks its expert (mteb's task types: "Classification", "Clustering", "STS", ...); task= picks
    # it and adds no prompt.
    classification = model.encode(["what a great film!"], prompt_name="Classification")
    clustering = model.encode(["what a great film!"], task="clustering")
    print("classification / clustering embedding shapes:", classification.shape, clustering.shape)


if __name__ == "__main__":
    main()
