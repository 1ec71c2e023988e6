# Named helpers of the ProteinGym benchmark's rules (workflow/rules/proteingym.smk).
from pmlm.proteingym.reference import read_selection

PROTEINGYM = config["proteingym"]
PROTEINGYM_DIR = f"{RESULTS}/proteingym"
PROTEINGYM_SELECTION = f"{PROTEINGYM_DIR}/assays.tsv"


def proteingym_enabled():
    """The benchmark runs when proteingym.archive names a source."""
    return bool(PROTEINGYM.get("archive"))


def proteingym_encoders():
    """The encoders ProteinGym scores: the pre-trained encoders proteingym.encoders lists, else all of them."""
    wanted = PROTEINGYM["encoders"]
    return [m for m in PRETRAIN_MODELS if not wanted or encoder_id(m) in wanted]


def proteingym_archive(wildcards=None):
    return downloaded(PROTEINGYM["archive"])


def proteingym_reference(wildcards=None):
    return source_file(PROTEINGYM["reference"])


def proteingym_fixed_assays():
    """The assays when the config names them (and no length limit drops any): known before anything runs."""
    assays = PROTEINGYM["assays"]
    return None if assays == "all" or PROTEINGYM["max_length"] is not None else list(dict.fromkeys(assays))


def proteingym_assay_ids():
    """DMS ids to score: the configured list, or the selection written by the checkpoint (all, or by length)."""
    fixed = proteingym_fixed_assays()
    if fixed is not None:
        return fixed
    selection = checkpoints.select_proteingym_assays.get().output[0]
    return [a.dms_id for a in read_selection(selection)]


def proteingym_select_args(wildcards):
    assays = PROTEINGYM["assays"]
    args = ["--assays", assays if assays == "all" else ",".join(assays)]
    if PROTEINGYM["max_length"] is not None:
        args += ["--max-length", str(PROTEINGYM["max_length"])]
    return " ".join(shlex.quote(a) for a in args)


def proteingym_scores_dir(m):
    return f"{PROTEINGYM_DIR}/scores/{encoder_id(m)}"


def proteingym_score_inputs(wildcards):
    return {"weights": pretrained_weights(model_of(wildcards)), "assays": PROTEINGYM_SELECTION,
            "archive": proteingym_archive()}


def proteingym_score_args(wildcards):
    """`pmlm proteingym score` flags from the config, and the encoder's row label."""
    flags = as_flags({k: PROTEINGYM[k] for k in ("double", "mismatch", "permutations", "device")})
    return f"{flags} --label {shlex.quote(encoder_label(model_of(wildcards)))}"


def proteingym_score_files(wildcards):
    """Every encoder's summary of every selected assay (after the selection when it depends on the data)."""
    ids = proteingym_assay_ids()
    return [f"{proteingym_scores_dir(m)}/{assay}.json" for m in proteingym_encoders() for assay in ids]


def proteingym_aggregate_args(wildcards):
    return " ".join(f"--encoder {shlex.quote(f'{encoder_label(m)}={proteingym_scores_dir(m)}')}"
                    for m in proteingym_encoders())


def proteingym_figure_prefix(wildcards, output):
    """The prefix `pmlm proteingym tables` extends with _categories and _doubles (from the first figure)."""
    return output.png[: -len("_categories.png")]


def proteingym_targets():
    if not proteingym_enabled():
        return []
    return [f"{RESULTS}/tables/proteingym.html", f"{RESULTS}/figures/proteingym_categories.svg",
            f"{RESULTS}/figures/proteingym_doubles.svg"]
