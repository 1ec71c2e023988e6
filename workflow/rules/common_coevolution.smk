# The planted-coupling study's helpers (workflow/lib/coevolution.py), bound to its config section for the rules of
# workflow/rules/coevolution.smk.
from coevolution import OBJECTIVES as COEVOLUTION_OBJECTIVES, CoevolutionStudy

coevolution_study = CoevolutionStudy(config["coevolution"], RESULTS, workflow.basedir)
COEVOLUTION_DIR = coevolution_study.dir
COEVOLUTION_LOGS = f"{LOGS}/coevolution"
