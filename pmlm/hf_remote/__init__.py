"""Files that ``pmlm export`` copies into an exported folder for ``transformers`` to run
(``trust_remote_code=True``); pmlm never imports them."""
