// Load an exported moe-embed ONNX folder with transformers.js (Node) and compare its vectors with reference ones.
//
//   cd scripts/clients/js && ONNXRUNTIME_NODE_INSTALL=skip npm install
//   node check.mjs FOLDER REFERENCE.json [--int8-file onnx/model_qint8_avx512_vnni.onnx] [--min-cos 0.9999]
//                  [--int8-min-cos 0.99]
//
// REFERENCE.json: {"texts": [...], "embeddings": [[...], ...]} (SentenceTransformer.encode of the source folder,
// the task prefix written in front of the text where there is one).
//
// Paths (each over every text alone and over all texts in one batch):
//   pipeline: pipeline('feature-extraction', folder, {dtype, model_file_name})(texts, {pooling: 'mean', normalize: true})
//             (transformers.js reads `last_hidden_state ?? logits ?? token_embeddings`: the graph's `last_hidden_state`)
//   automodel: AutoTokenizer + AutoModel, the graph's own `sentence_embedding` output
// Files: transformers.js loads `${subfolder}/${model_file_name ?? "model"}${suffix(dtype)}.onnx` with subfolder
// "onnx" and suffix "" for dtype "fp32" ("_quantized" for q8, "_int8" for int8, ...); so the fp32 graph is
// {dtype: "fp32"} and the int8 file onnx/model_qint8_avx512_vnni.onnx is
// {dtype: "fp32", model_file_name: "model_qint8_avx512_vnni"}.
//
// Prints one line per (file, path, batching) with max(1 - cosine) against the reference; exits 1 if an fp32 path
// is below --min-cos (default 0.9999) or an int8 path below --int8-min-cos (default 0.99), 2 on a load error.

import fs from "node:fs";
import path from "node:path";
import { AutoModel, AutoTokenizer, env, pipeline } from "@huggingface/transformers";

function parseArgs(argv) {
  const args = { positional: [], int8File: null, minCos: 0.9999, int8MinCos: 0.99 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--int8-file") args.int8File = argv[++i];
    else if (arg === "--min-cos") args.minCos = Number(argv[++i]);
    else if (arg === "--int8-min-cos") args.int8MinCos = Number(argv[++i]);
    else if (arg === "-h" || arg === "--help") {
      console.log("usage: node check.mjs FOLDER REFERENCE.json [--int8-file onnx/FILE.onnx] [--min-cos X] [--int8-min-cos X]");
      process.exit(0);
    } else args.positional.push(arg);
  }
  if (args.positional.length !== 2) {
    console.error("usage: node check.mjs FOLDER REFERENCE.json [--int8-file onnx/FILE.onnx]");
    process.exit(2);
  }
  return args;
}

function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return dot / Math.sqrt(na * nb);
}

function rows(tensor) {
  // a [batch, dim] tensor to arrays of numbers
  const [batch, dim] = tensor.dims;
  const data = Array.from(tensor.data, Number);
  return Array.from({ length: batch }, (_, i) => data.slice(i * dim, (i + 1) * dim));
}

function worst(vectors, reference) {
  let result = 0;
  for (let i = 0; i < reference.length; i++) {
    if (vectors[i].length !== reference[i].length) {
      throw new Error(`dimension ${vectors[i].length}, reference ${reference[i].length}`);
    }
    result = Math.max(result, 1 - cosine(vectors[i], reference[i]));
  }
  return result;
}

async function embedBoth(embed, texts) {
  // every text alone, then all texts in one batch (rows of different lengths: padding on the right)
  const alone = [];
  for (const text of texts) alone.push((await embed([text]))[0]);
  const batch = await embed(texts);
  return { alone, batch };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const folder = path.resolve(args.positional[0]);
  const reference = JSON.parse(fs.readFileSync(args.positional[1], "utf8"));
  const texts = reference.texts;
  const expected = reference.embeddings;

  // local folder only: the model id is the folder's name under env.localModelPath
  env.allowRemoteModels = false;
  env.allowLocalModels = true;
  env.localModelPath = path.dirname(folder) + path.sep;
  const modelId = path.basename(folder);

  let int8File = args.int8File;
  if (!int8File) {
    const onnxConfig = path.join(folder, "onnx_config.json");
    if (fs.existsSync(onnxConfig)) int8File = JSON.parse(fs.readFileSync(onnxConfig, "utf8"))?.int8?.file ?? null;
    if (!int8File && fs.existsSync(path.join(folder, "onnx", "model_qint8_avx512_vnni.onnx"))) {
      int8File = "onnx/model_qint8_avx512_vnni.onnx";
    }
  }
  const variants = [{ name: "fp32", file: "onnx/model.onnx", options: { dtype: "fp32" }, min: args.minCos }];
  if (int8File) {
    const parsed = path.parse(int8File);
    variants.push({
      name: "int8",
      file: int8File,
      options: { dtype: "fp32", subfolder: parsed.dir || "onnx", model_file_name: parsed.name },
      min: args.int8MinCos,
    });
  }

  console.log(`transformers.js ${env.version}, folder ${folder}, ${texts.length} texts`);
  let failed = false;
  let loadError = false;
  const report = (variant, route, mode, value) => {
    const ok = 1 - value >= variant.min;
    if (!ok) failed = true;
    console.log(
      `${variant.name.padEnd(5)} ${variant.file.padEnd(36)} ${route.padEnd(9)} ${mode.padEnd(5)} ` +
        `max(1-cos) ${value.toExponential(2)} ${ok ? "ok" : `FAIL (needs cosine >= ${variant.min})`}`,
    );
  };

  // one path on one file: `load()` gives `{embed, dispose}`; every text alone, then all in one batch
  const check = async (variant, route, load) => {
    try {
      const { embed, dispose } = await load();
      const { alone, batch } = await embedBoth(embed, texts);
      report(variant, route, "alone", worst(alone, expected));
      report(variant, route, "batch", worst(batch, expected));
      await dispose?.();
    } catch (error) {
      loadError = true;
      console.log(`${variant.name.padEnd(5)} ${variant.file.padEnd(36)} ${route.padEnd(9)} ERROR ${error?.stack ?? error}`);
    }
  };

  for (const variant of variants) {
    // (a) the feature-extraction pipeline: mean pooling over last_hidden_state, L2 normalised
    await check(variant, "pipeline", async () => {
      const extractor = await pipeline("feature-extraction", modelId, variant.options);
      const embed = async (batch) => rows(await extractor(batch, { pooling: "mean", normalize: true }));
      return { embed, dispose: () => extractor.dispose?.() };
    });
    // (b) AutoTokenizer + AutoModel, the graph's sentence_embedding output
    await check(variant, "automodel", async () => {
      const tokenizer = await AutoTokenizer.from_pretrained(modelId);
      const model = await AutoModel.from_pretrained(modelId, variant.options);
      const embed = async (batch) => {
        const outputs = await model(tokenizer(batch, { padding: true, truncation: true }));
        if (!outputs.sentence_embedding) {
          throw new Error(`no sentence_embedding output; outputs: ${Object.keys(outputs).join(", ")}`);
        }
        return rows(outputs.sentence_embedding);
      };
      return { embed, dispose: () => model.dispose?.() };
    });
  }
  if (loadError) process.exit(2);
  if (failed) process.exit(1);
  console.log("all paths agree with the reference");
}

await main();
