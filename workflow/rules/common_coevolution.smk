# The co-evolution study's helpers (workflow/lib/coevolution.py), bound to its config section for the rules of
# workflow/rules/coevolution.smk; a config without a coevolution: section has no study and no such jobs.
from coevolution import CoevolutionStudy, study_folder

coevolution_study = CoevolutionStudy(config.get("coevolution"), RESULTS, workflow.basedir)
COEVOLUTION_LOGS = f"{LOGS}/coevolution"
