# pmlm: Pairwise Masked Language Model reproduction workflow.
#   snakemake --cores 2                                   the embedded demo (config/config.yaml)
#   snakemake --profile slurm --configfile config/paper.yaml   the paper, on a SLURM cluster (profiles/slurm)
#   snakemake --report report.html                        tables, figures, configuration and versions in one page
import os
import sys

import psutil
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import min_version, validate
from pmlm.reports.run_summary import last_screen

# The workflow's own Python lives in workflow/lib (ARCHITECTURE.md): the config's checks, and the rules' helpers
# (paths, inputs, params, resources), which workflow/rules/common.smk binds to the config. It is workflow code,
# imported by path; no pmlm module imports it.
WORKFLOW_LIB = os.path.join(workflow.basedir, "workflow", "lib")
if WORKFLOW_LIB not in sys.path:
    sys.path.insert(0, WORKFLOW_LIB)
from workflow_config import check_references, require_config, schema_error

min_version("9.0")

# The demo's config/config.yaml comes from the workflow profile (profiles/default, loaded on every run); a
# --configfile on the command line replaces it. The schema is validated once, here, and fills every default
# it gives, so the rules read config values without defaults of their own.
SCHEMA = "workflow/schemas/config.schema.yaml"
require_config(config)
try:
    validate(config, SCHEMA, set_default=True)
except WorkflowError:
    raise schema_error(config, workflow.source_path(SCHEMA)) from None
check_references(config)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/common_coevolution.smk"
include: "workflow/rules/common_inference.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/release.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/tasks.smk"
include: "workflow/rules/coevolution.smk"
include: "workflow/rules/proteingym.smk"
include: "workflow/rules/inference.smk"
include: "workflow/rules/report.smk"


localrules:
    all,
    data,
    fetch_source,
    extract_member,
    expect_local_file,
    pretraining,
    tabulate_pretrain_scores,
    aggregate_tables,
    task_table,
    downstream,
    report_coevolution,
    coevolution,
    plot_pretrain_curves,
    plot_finetune_curves,
    plot_precision_by_separation,
    record_run_info,
    select_proteingym_assays,
    aggregate_proteingym,
    tabulate_proteingym,
    proteingym,
    inference,


rule all:
    input:
        datasets.targets(),
        encoders.targets(),
        runs.targets(),
        report_inputs.targets(),
        proteingym.targets(),
        inference.targets(),
    default_target: True


# The last screen (`pmlm summary`): when a run that did something succeeds, the tables and where they are, their
# headline numbers beside the paper's, the report command and the wall time since this Snakemake started. onsuccess
# runs in the Snakemake that was started (under --profile slurm too: jobs run with --no-hooks), never in a job.
RUN_STARTED = psutil.Process().create_time()


onsuccess:
    logger.info(
        last_screen(
            RESULTS,
            started=RUN_STARTED,
            snakefile=workflow.main_snakefile,
            configfiles=workflow.overwrite_configfiles,
            default_configfile=os.path.join(workflow.basedir, "config", "config.yaml"),
        )
    )
