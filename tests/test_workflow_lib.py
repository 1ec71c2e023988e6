"""The workflow's helpers (workflow/lib: flags, paths, sources, encoders, runs, report_inputs, resources,
proteingym_inputs) on the shipped configs, loaded as the Snakefile loads them (the files merged, the schema's defaults
filled): the paths, inputs, params and resources the rules get, with wildcards as plain namespaces."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from snakemake.utils import validate
from workflow_rules import REPO, workflow_module

from pmlm.proteingym.reference import Assay, write_selection
from pmlm.train.jobs import WorkflowConfig
from pmlm.vocabulary import MLM, PMLM, TABLE_PRETRAIN_SCORES, TABLE_UNSUPERVISED_CONTACT

flags = workflow_module("flags")
paths_lib = workflow_module("paths")
sources_lib = workflow_module("sources")
encoders_lib = workflow_module("encoders")
runs_lib = workflow_module("runs")
report_lib = workflow_module("report_inputs")
resources_lib = workflow_module("resources")
proteingym_lib = workflow_module("proteingym_inputs")

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
BASEDIR = "/repo"


def load(*names: str) -> dict:
    """config/<names>, merged as Snakemake merges --configfile files and validated as the Snakefile validates."""
    config = WorkflowConfig.load([REPO / "config" / name for name in names]).values
    validate(config, str(SCHEMA), set_default=True)
    return config


class Bound:
    """The helpers bound to one config, as workflow/rules/common.smk binds them."""

    def __init__(self, config: dict, checkpoints=None):
        self.paths = paths_lib.Paths(config["run"])
        self.sources = sources_lib.Sources(config, BASEDIR)
        self.datasets = sources_lib.Datasets(config, self.sources, self.paths)
        self.encoders = encoders_lib.Encoders(config, self.paths, self.sources, BASEDIR)
        self.task_data = runs_lib.TaskData(config, self.paths, self.sources)
        self.runs = runs_lib.Runs(config, self.paths, self.encoders, self.task_data, BASEDIR)
        self.report = report_lib.Report(config, self.paths, self.encoders, self.task_data, self.runs)
        self.proteingym = proteingym_lib.ProteinGym(config, self.paths, self.sources, self.encoders, checkpoints)
        self.resources = resources_lib.RuleResources(self.datasets, self.encoders)


@pytest.fixture(scope="module")
def demo() -> Bound:
    return Bound(load("config.yaml"))


@pytest.fixture(scope="module")
def paper() -> Bound:
    return Bound(load("paper.yaml"))


def encoder(dataset="demo", objective=PMLM, preset="tiny", **more) -> SimpleNamespace:
    return SimpleNamespace(dataset=dataset, objective=objective, preset=preset, **more)


class Output(list):
    """A rule's output: a list with named entries as attributes (Snakemake's Namedlist)."""

    def __init__(self, *files, **named):
        super().__init__([*files, *(f for v in named.values() for f in (v if isinstance(v, list) else [v]))])
        self.__dict__.update(named)


class Input(dict):
    """A rule's named input: ``items()`` and attributes."""

    def __getattr__(self, name):
        return self[name]


# --- flags: no config


def test_one_of_matches_exactly_the_names_and_nothing_when_there_are_none():
    assert flags.one_of(["a.b", "c"]) == r"a\.b|c"
    assert flags.one_of([]) == "NONE"


def test_params_are_canonical_whatever_the_order_of_the_mappings():
    sorted_value = flags.canonical({"b": [{"y": 1, "x": 2}], "a": 1})
    assert list(sorted_value) == ["a", "b"] and list(sorted_value["b"][0]) == ["x", "y"]
    assert flags.as_sets({"b": True, "a": "x y"}) == "--set 'a=x y' --set b=true"
    assert flags.as_flags({"min_seq_id": 0.5, "fractions": [0.8, 0.2]}) == "--min-seq-id 0.5 --fractions 0.8 0.2"


def test_outputs_give_their_folder_and_prefix():
    output = Output("out/t.md", "out/t.csv", table=["out/s.csv", "out/s.md"])
    assert flags.output_dir(None, output) == "out"
    assert flags.output_prefix(None, output) == "out/t"
    assert flags.named_output_prefix("table")(None, output) == "out/s"
    assert flags.workflow_path("config/x.yaml", BASEDIR) == "/repo/config/x.yaml"
    assert flags.workflow_path("/abs/x.yaml", BASEDIR) == "/abs/x.yaml"


def test_test_args_name_every_test_input_and_nothing_else():
    input = Input(head="h.safetensors", test_cb513="a b.json", test_ts115="t.json")
    assert flags.test_args(None, input) == "--test 'cb513=a b.json' --test ts115=t.json"
    assert flags.result_args(None, ["a.tsv", "b c.tsv"]) == "--result a.tsv --result 'b c.tsv'"


# --- paths


def test_a_rule_pattern_and_a_configured_encoder_share_one_template():
    paths = paths_lib.Paths("demo")
    pattern = paths.finetune_dir(*paths_lib.ENCODER_WILDCARDS, "{ft}")
    assert pattern == "results/demo/finetune/{dataset}/{objective}-{preset}/{ft}"
    assert paths.finetune_dir("demo", PMLM, "tiny", "ss3") == f"results/demo/finetune/demo/{PMLM}-tiny/ss3"
    assert paths.pretrain_metrics_path("d", MLM, "p") == f"results/demo/pretrain/d/{MLM}-p/metrics.csv"
    assert paths.contact_map_prefix("d", MLM, "p", "r") == f"results/demo/figures/contact_maps/d/{MLM}-p/r"
    assert (paths.logs, paths.bench, paths.report_dir) == ("logs/demo", "benchmarks/demo", "results/demo/report")
    assert paths.table_prefix(TABLE_PRETRAIN_SCORES) == f"results/demo/tables/{TABLE_PRETRAIN_SCORES}"


# --- sources and datasets


def test_a_relative_file_url_is_read_from_the_workflow_folder(demo):
    source = SimpleNamespace(source="uniprot_sample")
    assert demo.sources.fetch_url(source) == "file:///repo/data/demo/uniprot_sample.fasta.gz"
    assert demo.sources.downloaded_archive(source) == "resources/sources/uniprot_sample/uniprot_sample.fasta.gz"
    assert demo.sources.checksum_args(source) == (
        "--sha256 f03d5f021ca8089955bc86d58ce5a985045d0f064a07d1ea1f17c31fa1d7f091"
    )


def test_an_archive_member_is_a_source_file_and_the_remote_checksums_are_passed(paper):
    assert paper.sources.source_file("uniref50_2018_03") == (
        "resources/sources/uniref50_2018_03/members/uniref50.tar/uniref50.xml.gz"
    )
    checksums = paper.sources.checksum_args(SimpleNamespace(source="uniref50_2018_03"))
    assert checksums.startswith("--checksums-from https://ftp.uniprot.org/") and "--sha256" not in checksums


def test_a_released_checkpoint_is_one_more_source():
    bound = Bound(load("released.yaml"))
    name = "release-ur50-release-pmlm-650m"
    assert bound.sources.sources[name]["sha256"].startswith("41ec3830")
    assert bound.sources.downloaded(name) == f"resources/sources/{name}/pmlm_650m.pt"


def test_a_dataset_overlays_its_own_settings_on_the_global_ones(demo):
    w = SimpleNamespace(dataset="demo")
    assert demo.datasets.dataset_sources(w) == ["resources/sources/uniprot_sample/uniprot_sample.fasta.gz"]
    assert demo.datasets.decontamination_sources(w) == ["resources/sources/pdb_chains/pdb_chains_sample.jsonl.gz"]
    assert demo.datasets.ingest_formats(w) == "auto"
    assert "--set max_length=4000" in demo.datasets.ingest_args(w)
    assert demo.datasets.split_args(w).endswith("--valid-fraction 0.03")
    assert demo.datasets.tokenize_args(w) == "--compression-level 1 --num-shards 4 --row-group-size 512"
    assert demo.datasets.shard_setting("demo", "row_group_size") == 512
    assert demo.datasets.targets() == [demo.datasets.dataset_shards(w)] == ["results/demo/data/demo/shards"]
    references = Input(references=["a b.fa"])
    assert demo.datasets.decontamination_args(w, references) == "--decontaminate 'a b.fa'"
    assert demo.datasets.decontamination_args(w, Input(references=[])) == ""


# --- encoders


def test_an_encoder_is_found_by_its_wildcards_and_labelled(demo):
    m = demo.encoders.model_of(encoder())
    assert m == {"dataset": "demo", "objective": PMLM, "preset": "tiny"}
    assert demo.encoders.model_label(encoder()) == "PMLM-tiny@demo"
    assert demo.encoders.pretrained_weights(m) == f"results/demo/pretrain/demo/{PMLM}-tiny/model.safetensors"
    with pytest.raises(ValueError, match="no pre-trained model demo/pmlm-large"):
        demo.encoders.model_of(encoder(preset="large"))


def test_pretraining_reads_its_recipe_and_names_its_objective(demo):
    assert demo.encoders.recipe_file(encoder()) == "/repo/config/train/tiny.yaml"
    assert demo.encoders.pretrain_overrides(encoder(objective=MLM)) == f"--set objective.name={MLM}"
    weights = demo.encoders.pretrained_targets()
    assert demo.encoders.pretrain_table_args(None, Input(weights=weights)) == " ".join(
        f"--model {label}:demo:{w}" for label, w in zip(("MLM-tiny", "PMLM-tiny"), weights)
    )


def test_the_kl_figure_reads_the_pair_encoders_on_their_datasets(demo):
    assert [m["objective"] for m in demo.encoders.kl_models()] == [PMLM]
    assert demo.encoders.kl_datasets() == ["demo"]
    assert demo.encoders.kl_args(None, None) == (
        f"--model PMLM-tiny@demo=results/demo/pretrain/demo/{PMLM}-tiny/model.safetensors "
        "--valid demo=results/demo/data/demo/shards --pairs 16 --seed 0 --sequences 64"
    )
    assert demo.encoders.targets()[-2:] == [
        f"results/demo/tables/{TABLE_PRETRAIN_SCORES}.html",
        "results/demo/figures/kl_histogram.svg",
    ]


def test_a_release_is_imported_not_trained():
    bound = Bound(load("released.yaml"))
    w = SimpleNamespace(release=f"ur50-release/{PMLM}-650m")
    assert bound.encoders.trained_models() == [] and bound.encoders.checkpoint_releases() == bound.encoders.released
    assert bound.encoders.released_checkpoint(w) == "resources/sources/release-ur50-release-pmlm-650m/pmlm_650m.pt"
    assert bound.encoders.release_objective(w) == PMLM
    assert bound.encoders.folder_datasets() == ["ur50-release"]
    # no validation set of this config: no KL figure
    assert bound.encoders.kl_datasets() == [] and not any("kl_histogram" in t for t in bound.encoders.targets())


def test_a_transformers_release_names_a_hub_id_or_a_local_folder(tmp_path):
    config = load("config.yaml")
    local = tmp_path / "esm"
    local.mkdir()
    models = [
        {"dataset": "hub", "objective": MLM, "preset": "esm", "release": {"huggingface": "org/esm", "revision": "v1"}},
        {"dataset": "local", "objective": MLM, "preset": "esm", "release": {"huggingface": str(local)}},
    ]
    config["pretrain"]["models"] = models
    encoders = Bound(config).encoders
    hub, folder = SimpleNamespace(release=f"hub/{MLM}-esm"), SimpleNamespace(release=f"local/{MLM}-esm")
    assert encoders.transformers_releases() == models and encoders.checkpoint_releases() == []
    assert encoders.transformers_model(hub) == "org/esm" and encoders.transformers_inputs(hub) == []
    assert encoders.transformers_revision(hub) == "--revision v1" and encoders.transformers_revision(folder) == ""
    assert encoders.transformers_inputs(folder) == [os.path.join(str(local), "config.json")]


# --- fine-tuning runs and the downstream tables


def test_a_run_gets_its_encoder_task_files_and_recipe(demo):
    w = encoder(ft="net_charge")
    assert demo.runs.finetune_inputs(w) == {
        "encoder": f"results/demo/pretrain/demo/{PMLM}-tiny/model.safetensors",
        "train": "results/demo/tasks/net_charge/train.parquet",
        "valid": "results/demo/tasks/net_charge/valid.parquet",
        "recipe": "/repo/config/finetune/regression_tiny.yaml",
    }
    # a labelled table: the columns the recipe reads (not its split column)
    assert demo.runs.finetune_overrides(w) == (
        "--set data.id_column=id --set data.label_column=net_charge --set data.sequence_column=sequence"
    )
    assert demo.runs.evaluate_inputs(encoder(ft="ss3")) == {
        "head": f"results/demo/finetune/demo/{PMLM}-tiny/ss3/head.safetensors",
        "test_demo_test": "results/demo/tasks/demo_pdb/test.jsonl",
    }
    assert demo.runs.unsupervised_inputs(encoder())["test_demo_test"] == "results/demo/tasks/demo_pdb/test.jsonl"


def test_a_run_gives_each_encoder_its_features(paper):
    assert paper.runs.finetune_overrides(encoder("uniref50", PMLM, "base", ft="raptorx_contact_linear")) == (
        "--set head.features=M+"
    )
    # features: auto leaves the recipe's own head.features
    assert paper.runs.finetune_overrides(encoder("uniref50", PMLM, "base", ft="stability")) == ""


def test_a_run_applies_to_the_encoders_it_lists(paper):
    pfam_mlm = paper.encoders.model_of(encoder("pfam", MLM, "base"))
    assert paper.runs.runs_for(pfam_mlm) == ["raptorx_contact_linear", "tape_contact_linear"]
    assert paper.task_data.task_file("raptorx", "test") == "resources/local/raptorx_test.jsonl"
    assert paper.task_data.task_file("tape_stability", "train") == (
        "resources/sources/tape_stability/members/stability/stability_train.json"
    )


def test_task_data_is_split_by_its_own_flags(demo):
    assert demo.task_data.derived == ["demo_pdb"] and demo.task_data.tables == ["net_charge"]
    assert demo.task_data.structure_source(SimpleNamespace(taskdata="demo_pdb")) == (
        "resources/sources/pdb_chains/pdb_chains_sample.jsonl.gz"
    )
    assert demo.task_data.structure_split_args(SimpleNamespace(taskdata="demo_pdb")) == (
        "--coverage 0.5 --fractions 0.8 0.1 0.1 --min-seq-id 0.3 --seed 0"
    )
    assert demo.task_data.table_split_args(SimpleNamespace(tabledata="net_charge")) == (
        "--sequence-column sequence --coverage 0.5 --fractions 0.6 0.1 0.3 --min-seq-id 0.3 --seed 0"
    )


def test_every_evaluation_goes_to_its_table_and_task_runs_to_their_own(demo):
    results = demo.runs.evaluation_results()
    kinds = [kind for kind, _ in results]
    assert len(results) == 2 * 3 + 1  # three tabled runs on both encoders, the PMLM encoder's read-out
    assert kinds[-1] == TABLE_UNSUPERVISED_CONTACT
    assert results[-1][1] == f"results/demo/evaluation/demo/{PMLM}-tiny/unsupervised-pair-kl.tsv"
    assert demo.runs.table_args(None, ["x.tsv"]) == f"--result {kinds[0]}=x.tsv"
    assert demo.runs.task_table_runs() == ["net_charge", "net_charge_lora"]
    assert demo.runs.task_table_inputs(SimpleNamespace(taskrun="net_charge")) == [
        f"results/demo/evaluation/demo/{MLM}-tiny/net_charge.tsv",
        f"results/demo/evaluation/demo/{PMLM}-tiny/net_charge.tsv",
    ]
    assert demo.runs.targets()[-2:] == [
        "results/demo/tables/net_charge.html",
        "results/demo/tables/net_charge_lora.html",
    ]


# --- the report


def test_the_report_draws_the_contact_maps_it_names(demo):
    pmlm = demo.encoders.model_of(encoder())
    prefix = f"results/demo/figures/contact_maps/demo/{PMLM}-tiny"
    assert demo.report.contact_map_figures(pmlm) == [
        f"{prefix}/contact_resnet.svg",
        f"{prefix}/unsupervised-pair-kl.svg",
    ]
    assert demo.report.contact_map_inputs(encoder(ft="contact_resnet")) == {
        "head": f"results/demo/finetune/demo/{PMLM}-tiny/contact_resnet/head.safetensors",
        "test": "results/demo/tasks/demo_pdb/test.jsonl",
    }
    assert demo.report.readout_map_inputs(encoder())["test"] == "results/demo/tasks/demo_pdb/test.jsonl"
    assert len(demo.report.contact_tsvs()) == 2 * 2 + 1  # two contact runs on both encoders, one read-out
    assert demo.report.targets()[:4] == [
        "results/demo/report/run_info.html",
        "results/demo/figures/pretrain_curves.svg",
        "results/demo/figures/finetune_curves.svg",
        "results/demo/figures/precision_by_separation.svg",
    ]


def test_the_curves_label_each_run_in_the_order_of_the_input(demo):
    metrics = Input(metrics=["a.csv", "b.csv"])
    assert demo.report.pretrain_curve_args(None, metrics) == "--run MLM-tiny@demo=a.csv --run PMLM-tiny@demo=b.csv"
    assert demo.report.finetune_curve_args(None, metrics) == (
        "--run 'MLM-tiny@demo contact_linear=a.csv' --run 'MLM-tiny@demo contact_resnet=b.csv'"
    )
    assert '"run": "demo"' in demo.report.run_config_json(None)


# --- resources


def test_fixed_resources_grow_with_the_attempt():
    assert resources_lib.per_attempt(4000)(None, 2) == 8000


def test_resources_grow_with_the_input(tmp_path, demo):
    big = tmp_path / "in.fa"
    big.write_bytes(b"\0" * (120 * 2**20))
    assert resources_lib.input_mib([str(big)]) == 120
    assert resources_lib.ingest_mem_mb(None, [str(big)], 1) == 1012
    assert resources_lib.ingest_runtime(None, [str(big)], 2) == 2 * (15 + 2)
    assert resources_lib.split_mem_mb(None, [str(big)], 1) == 2000 + 480
    assert resources_lib.split_runtime(None, [str(big)], 1) == 33
    assert resources_lib.tokenize_runtime(None, [str(big)], 1) == 16
    # 4 shards x 512 rows x 500 bytes ~ 1 MiB waiting for row groups, plus a tenth of the input
    assert demo.resources.tokenize_mem_mb(SimpleNamespace(dataset="demo"), [str(big)], 1) == 1000 + 12 + 0


def test_a_large_released_encoder_gets_the_larger_amount(demo):
    bound = Bound(load("released.yaml"))
    release = encoder("ur50-release", PMLM, "650m")
    assert bound.resources.by_encoder(4000, 16000)(release, 2) == 32000
    assert bound.resources.for_kl_models(8000, 16000)(None, 1) == 16000
    assert demo.resources.by_encoder(4000, 16000)(encoder(), 1) == 4000
    size = 2723505310
    mem = bound.resources.import_mem_mb(SimpleNamespace(release=f"ur50-release/{PMLM}-650m"), 1)
    assert mem == 1000 + int(1.5 * size / 2**20)


@pytest.mark.parametrize(
    "resources, launcher",
    [
        ({"gpu": 1}, "python -m pmlm launch --gpus-per-node 1 --"),
        ({"gpu": 8, "nodes": 2}, "python -m pmlm launch --gpus-per-node 4 --"),
        ({"gres": "gpu:a100:4", "nodes": 2, "gpu": 1}, "python -m pmlm launch --gpus-per-node 4 --"),
        ({}, "python -m pmlm launch --"),
        ({"gpu": 1, "launch_env": "A=1 B=x"}, "python -m pmlm launch --gpus-per-node 1 --env A=1 --env B=x --"),
    ],
)
def test_pretraining_launches_one_trainer_per_gpu_of_each_node(resources, launcher):
    assert resources_lib.pretrain_launcher(None, resources) == launcher


def test_fine_tuning_launches_one_trainer():
    assert resources_lib.finetune_launcher(None, {"gpu": 4}) == "python -m pmlm launch --gpus-per-node 1 --"


# --- ProteinGym


def test_proteingym_scores_the_configured_assays_with_every_encoder():
    config = load("proteingym.yaml")
    config["proteingym"]["assays"] = ["B", "A", "B"]
    gym = Bound(config).proteingym
    assert gym.enabled() and gym.fixed_assays() == ["B", "A"]
    assert gym.select_args(None) == "--assays B,A,B"
    release = encoder("ur50-release", PMLM, "650m")
    prefix = f"results/proteingym/proteingym/scores/ur50-release/{PMLM}-650m"
    assert gym.score_files(release) == [f"{prefix}/B.json", f"{prefix}/A.json"]
    assert gym.score_inputs(release) == {
        "weights": f"results/proteingym/pretrain/ur50-release/{PMLM}-650m/model.safetensors",
        "assays": "results/proteingym/proteingym/assays.tsv",
        "archive": "resources/sources/proteingym_substitutions/DMS_ProteinGym_substitutions.zip",
    }
    assert gym.score_args(release) == (
        "--double auto --mismatch skip --permutations 1000 --device auto --label PMLM-650m@ur50-release"
    )
    assert gym.aggregate_args(None) == f"--encoder PMLM-650m@ur50-release={prefix}"
    assert gym.reference() == "resources/sources/proteingym_reference/DMS_substitutions.csv"
    output = SimpleNamespace(png="results/x/figures/proteingym_categories.png")
    assert gym.figure_prefix(None, output) == "results/x/figures/proteingym"


def test_proteingym_reads_the_assays_the_checkpoint_selected(tmp_path):
    selection = tmp_path / "assays.tsv"
    write_selection(
        selection, [Assay("A1_HUMAN", "A1.csv", "A1", "Activity", "MKV"), Assay("B", "B.csv", "B", "x", "M")]
    )
    checkpoint = SimpleNamespace(get=lambda: SimpleNamespace(output=[str(selection)]))
    gym = Bound(load("proteingym.yaml"), SimpleNamespace(select_proteingym_assays=checkpoint)).proteingym
    assert gym.fixed_assays() is None and gym.select_args(None) == "--assays all"
    assert gym.assay_ids() == ["A1_HUMAN", "B"]


def test_proteingym_is_off_without_an_archive(demo):
    assert not demo.proteingym.enabled() and demo.proteingym.targets() == []
