"""The keys of the JSON files this project reads, checked as they are read: a dataset's meta.json
(lib/batches.read_meta) and a checkpoint's config.json (model.from_checkpoint), whose shape keys
are also checked against the shapes of its weights. Each check names the file, the key and what it
should hold, whoever wrote the file."""

from lib.common import Error

# a value's kind -> (its Python types, how a message names it)
KINDS = {
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    bool: ((bool,), "true or false"),
    str: ((str,), "a string"),
    list: ((list,), "a list"),
    dict: ((dict,), "an object"),
}


def kind_of(value, kind):
    """Whether value is of kind (booleans are not integers, nor numbers)."""
    types, _ = KINDS[kind]
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, types)


def shown(value):
    """A value as a message quotes it: short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Checker:
    """The checks of one file: each failure is an Error `path: what; fix`."""

    def __init__(self, path, fix):
        self.path = path
        self.fix = fix

    def fail(self, what):
        raise Error(f"{self.path}: {what}; {self.fix}")

    def object(self, value, what="the file"):
        if not isinstance(value, dict):
            self.fail(f"{what} holds {type(value).__name__} {shown(value)}, not a JSON object")
        return value

    def key(self, mapping, key, kind, low=None, optional=False, where=""):
        """mapping[key], which must be of kind (and >= low when given); an optional key may be
        absent or null (-> None)."""
        name = f"{where}{key}"
        if mapping.get(key) is None:
            if optional:
                return None
            self.fail(f"no {name!r} key")
        value = mapping[key]
        if not kind_of(value, kind):
            self.fail(f"{name!r} must be {KINDS[kind][1]}, got {shown(value)}")
        if low is not None and value < low:
            self.fail(f"{name!r} must be >= {low}, got {shown(value)}")
        return value

    def tokenizer(self, spec, vocab_size=None):
        """A tokenizer spec: {"type": "char", "chars": str} or {"type": "bpe", "encoding": str},
        whose size fits vocab_size when given (a BPE encoding's size is known once loaded)."""
        if spec is None:
            self.fail("no 'tokenizer' key")
        self.object(spec, "'tokenizer'")
        kind = self.key(spec, "type", str, where="tokenizer.")
        if kind == "char":
            chars = self.key(spec, "chars", str, where="tokenizer.")
            if not chars:
                self.fail("'tokenizer.chars' is empty: it holds the vocabulary's characters")
            if vocab_size is not None and len(chars) > vocab_size:
                self.fail(
                    f"'tokenizer.chars' holds {len(chars):,} tokens, vocab_size {vocab_size:,}"
                )
        elif kind == "bpe":
            self.key(spec, "encoding", str, where="tokenizer.")
            self.key(spec, "lowercase", bool, optional=True, where="tokenizer.")
        else:
            self.fail(f"'tokenizer.type' {shown(kind)} is neither char nor bpe")
        return spec

    def label_names(self, mapping, n_classes=None, optional=False):
        """A list of distinct strings, one per class when n_classes is given."""
        names = self.key(mapping, "label_names", list, optional=optional)
        if names is None:
            return None
        if not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
            self.fail("'label_names' must be a list of distinct strings")
        if n_classes is not None and len(names) != n_classes:
            self.fail(f"'label_names' names {len(names)} classes, the model has {n_classes}")
        return names


# how many token ids each dtype of a dataset's files holds
ID_LIMITS = {"uint16": 2**16, "uint32": 2**32}


def check_meta(meta, path):
    """A prepared dataset's meta.json (data/README.md): an object, a task (lm or classify), and the
    keys of that task, each of its type."""
    c = Checker(path, "the data is damaged or from another version: run its prepare.py again")
    c.object(meta)
    task = meta.get("task")
    if task not in ("lm", "classify"):
        c.fail(f"task {shown(task)} is neither lm nor classify")
    vocab_size = c.key(meta, "vocab_size", int, low=1)
    c.tokenizer(meta.get("tokenizer"), vocab_size)
    dtype = c.key(meta, "dtype", str)
    if dtype not in ("uint16", "uint32"):
        c.fail(f"dtype {dtype!r} is neither uint16 nor uint32")
    if vocab_size > ID_LIMITS[dtype]:
        c.fail(f"vocab_size {vocab_size:,} has ids past what {dtype} holds")
    splits = c.object(c.key(meta, "splits", dict), "'splits'")
    for split in splits:
        c.key(splits, split, int, low=0, where="splits.")
    if task == "classify":
        c.label_names(meta)
        c.key(meta, "max_length", int, low=1)
        pad = c.key(meta, "pad_token_id", int, low=0)
        if pad >= vocab_size:
            c.fail(f"'pad_token_id' {pad} is past vocab_size {vocab_size}")
    return meta


def check_card(info, path, config_fields):
    """A checkpoint's config.json: an object whose 'model' holds the config's fields, each of its
    type (config_fields: {architecture: {field: kind}}), a tokenizer, and a classifier's label
    names, one per class."""
    c = Checker(path, "not a checkpoint config.json that train.py wrote, or damaged")
    c.object(info)
    architecture = c.key(info, "architecture", str)
    if architecture not in config_fields:
        c.fail(f"'architecture' {shown(architecture)} is none of {', '.join(config_fields)}")
    model = c.object(c.key(info, "model", dict), "'model'")
    for name, kind in config_fields[architecture].items():
        c.key(model, name, kind, optional=True, where="model.")
    c.key(info, "weights_id", str, optional=True)
    vocab_size = c.key(model, "vocab_size", int, low=1, where="model.")
    # a card without a tokenizer loads; the scripts that encode text refuse it (get_tokenizer)
    if "tokenizer" in info:
        c.tokenizer(info["tokenizer"], vocab_size)
    if architecture == "EncoderClassifier":
        c.label_names(info, model.get("n_classes"), optional=True)
        c.key(info, "max_length", int, low=1, optional=True)
    return info


def check_shapes(info, path, shapes):
    """A checkpoint's config.json (checked by check_card) against the tensors of its weights
    (shapes: {name: shape}, from model.safetensors' header, without reading the tensors): a card
    that does not fit its weights fails here, in one line, before a model of its shape is built
    (a card of 10**6 layers would take minutes and all the memory to build first). Keys the card
    leaves out and tensors the weights lack are the load's to report."""
    c = Checker(path, "not a checkpoint config.json that train.py wrote, or damaged")
    model = info["model"]
    for key, found in weights_shape(shapes).items():
        given = model.get(key)
        if given is not None and given != found:
            c.fail(f"'model.{key}' is {shown(given)}, the weights' shapes say {shown(found)}")
    return info


def weights_shape(shapes):
    """The config values that the tensors' names and shapes fix: {key: value}. The token table
    (the tied head's name, if the file kept that one) gives the vocabulary and width; a position
    table, the context and no rotary embeddings; the blocks' names, the depth; a classifier's head
    and fastText table, its classes and buckets."""
    table = shapes.get("wte.weight", shapes.get("lm_head.weight"))
    if table is None or len(table) != 2:
        return {}
    found = {"vocab_size": table[0], "n_embd": table[1]}
    blocks = {name.split(".")[1] for name in shapes if name.startswith("blocks.")}
    found["n_layer"] = len(blocks)
    found["bias"] = "ln_f.bias" in shapes
    positions = shapes.get("wpe.weight")
    found["rope"] = positions is None
    if positions is not None:
        found["block_size"] = positions[0]
    head = shapes.get("head.weight")
    if head is not None:
        found["n_classes"] = head[0]
        bow = shapes.get("bow.weight")
        found["bow_head"] = bow is not None
        if bow is not None:
            found["bow_buckets"] = bow[0] - table[0]
    return found


# each shape key's name in a Hugging Face GPT-2 config.json
HF_NAMES = {
    "vocab_size": "vocab_size",
    "n_embd": "n_embd",
    "n_layer": "n_layer",
    "block_size": "n_positions",
}


def check_hf_shapes(hf, path, shapes):
    """A Hugging Face GPT-2 config.json against its weights' shapes (shapes: in this project's
    tensor names), as check_shapes a card: before a model of the config's shape is built."""
    c = Checker(path, "not a GPT-2 config.json that fits the model.safetensors beside it")
    found = weights_shape(shapes)
    for key, name in HF_NAMES.items():
        given = hf.get(name)
        if key in found and given != found[key]:
            c.fail(f"{name!r} is {shown(given)}, the weights' shapes say {shown(found[key])}")
    return hf
