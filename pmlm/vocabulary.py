"""The names every layer agrees on, from the config files to the tables: the pre-training objectives, the
features a task head reads, the devices a run or command computes on and the precisions it computes in, the
downstream tasks, the tables evaluations feed and the tables written. Standard
library only, so the command layer and the workflow can import it."""

from __future__ import annotations

from pmlm.choices import Device

# pre-training objectives, as recipes, sidecars and the workflow config spell them
MLM = "mlm"  # cross-entropy of the token head on masked residues
PMLM = "pmlm"  # L_mlm + lambda * L_pmlm over every ordered pair of masked residues
PMLM_PAIR_ONLY = "pmlm_pair_only"  # the pair loss alone, with the diagonal; no token head
TMLM = "tmlm"  # PMLM plus a factorised triple-joint loss on sampled triples of masked residues
OBJECTIVES = (MLM, PMLM, PMLM_PAIR_ONLY, TMLM)

# the features a task head reads, named as in the paper
FEATURES_M = "M"  # encoder outputs (pairs: concat(h_i * h_j, h_i - h_j))
FEATURES_M_PLUS = "M+"  # the pair head's first block on those pair features (contact heads of PMLM encoders)
FEATURES_PAIR_JOINT = "pair joint"  # no head: the pair head's joint read out as unsupervised contact scores

# where a run or command computes (recipes' ``device``, commands' ``--device``; the type: pmlm.choices.Device)
DEVICES = Device.values()

# downstream task names, as recipes' `task`, head.json and the evaluation TSVs spell them (the task types are in
# pmlm/tasks/: contact_task, residue_tasks, sequence_tasks; a user's own task registers its name there)
TASK_CONTACT = "contact"  # contact maps (TAPE's ProteinNet, RaptorX, structure JSONL)
TASK_SS3 = "ss3"  # 3-state secondary structure per residue
TASK_REMOTE_HOMOLOGY = "remote_homology"  # TAPE's fold classes per protein
TASK_FLUORESCENCE = "fluorescence"  # TAPE's GFP log-fluorescence per protein
TASK_STABILITY = "stability"  # TAPE's stability score per protein
TASK_RESIDUE_CLASSIFICATION = "residue_classification"  # a user's classes per residue, from a table file
TASK_SEQUENCE_CLASSIFICATION = "sequence_classification"  # a user's class per protein, from a table file
TASK_SEQUENCE_REGRESSION = "sequence_regression"  # a user's value per protein, from a table file
TASKS = (
    TASK_CONTACT,
    TASK_SS3,
    TASK_REMOTE_HOMOLOGY,
    TASK_FLUORESCENCE,
    TASK_STABILITY,
    TASK_RESIDUE_CLASSIFICATION,
    TASK_SEQUENCE_CLASSIFICATION,
    TASK_SEQUENCE_REGRESSION,
)

# the tables an evaluation TSV feeds, as the workflow config's finetune.runs.<name>.table (its schema's enum) and
# `pmlm tables results --result KIND=TSV` spell them; each is also the name of the table it writes, but for
# TABLE_CONTACT_ABLATION, whose runs feed the ablation table only
TABLE_TAPE_CONTACT = "tape_contact"  # TAPE-Contact: P@L/5 at s >= 12, linear head
TABLE_RAPTORX_CONTACT = "raptorx_contact"  # RaptorX-Contact: long-range P@L, ResNet head
TABLE_CONTACT_ABLATION = "contact_ablation"  # contact runs that feed only the ablation table
TABLE_SECONDARY_STRUCTURE = "secondary_structure"  # Q3 per test set
TABLE_REMOTE_HOMOLOGY = "remote_homology"  # top-1 fold accuracy per holdout
TABLE_UNSUPERVISED_CONTACT = "unsupervised_contact"  # the pair head's read-outs, no fine-tuning run
# a table of the run's own, tables/<run>.*, with its task's metrics (`pmlm tables task`): TAPE's fluorescence and
# stability, a user's task
TABLE_TASK = "task"
RUN_TABLE_KINDS = (  # what a fine-tuning run's `table:` may name
    TABLE_TAPE_CONTACT,
    TABLE_RAPTORX_CONTACT,
    TABLE_CONTACT_ABLATION,
    TABLE_SECONDARY_STRUCTURE,
    TABLE_REMOTE_HOMOLOGY,
    TABLE_TASK,
)
TABLE_KINDS = (*RUN_TABLE_KINDS[:-1], TABLE_UNSUPERVISED_CONTACT)  # what `pmlm tables results` reads
CONTACT_TABLE_KINDS = (TABLE_TAPE_CONTACT, TABLE_RAPTORX_CONTACT, TABLE_CONTACT_ABLATION)  # runs that predict contacts
# the tables written under results/<run>/tables (<name>.csv, .md, .tex, .html), besides the kinds' own
TABLE_ABLATION = "ablation"  # long-range P@L by objective x head x data, from every contact kind
TABLE_PRETRAIN_SCORES = "pretrain_scores"  # validation losses and accuracies of the pre-trained encoders
TABLE_PRECISION_BY_SEPARATION = "precision_by_separation"  # contact precision by sequence separation
RESULT_TABLES = (  # what `pmlm tables results` writes, in this order
    TABLE_TAPE_CONTACT,
    TABLE_RAPTORX_CONTACT,
    TABLE_ABLATION,
    TABLE_SECONDARY_STRUCTURE,
    TABLE_REMOTE_HOMOLOGY,
    TABLE_UNSUPERVISED_CONTACT,
)

# what the workflow's inference target computes for every sequence of a FASTA file, as the config's
# inference.outputs (its schema's enum), the files results/<run>/inference/<encoder>/<output>.parquet,
# `pmlm gather OUTPUT` and `pmlm plan`'s inference rows spell them
OUTPUT_EMBEDDINGS = "embeddings"  # pmlm embed: per residue (and per sequence, its mean)
OUTPUT_SUBSTITUTIONS = "substitutions"  # pmlm score --saturation: every single substitution of every sequence
OUTPUT_CONTACTS = "contacts"  # pmlm contacts: the top-scoring residue pairs of every sequence
INFERENCE_OUTPUTS = (OUTPUT_EMBEDDINGS, OUTPUT_SUBSTITUTIONS, OUTPUT_CONTACTS)
