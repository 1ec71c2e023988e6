"""The run's configuration and software versions as a page of the workflow report (and as JSON)."""

from __future__ import annotations

import html
import json
import platform
from pathlib import Path

import yaml

from pmlm.errors import ConfigError
from pmlm.outputs import prefix_targets, writing_files
from pmlm.reports.tables import HTML_STYLE
from pmlm.version import versions

RUN_INFO_SUFFIXES = (".html", ".json")


def collect(config_json: str, snakemake_version: str | None) -> dict:
    try:
        config = json.loads(config_json)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config-json is not JSON ({exc.msg} at character {exc.pos})") from None
    v = versions()
    v["snakemake"] = snakemake_version
    v["platform"] = platform.platform()
    return {"versions": v, "config": config}


def page(info: dict) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(name)}</td><td>{esc(str(value) if value is not None else '–')}</td></tr>"
        for name, value in info["versions"].items()
    )
    config = yaml.safe_dump(info["config"], sort_keys=False, default_flow_style=False)
    return (
        "\n".join(
            [
                "<!DOCTYPE html>",
                '<html lang="en"><head><meta charset="utf-8"><title>run_info</title>',
                f"<style>{HTML_STYLE}pre{{background:#f4f4f4;padding:.8em;font-size:.85em}}</style></head><body>",
                '<h2>Software versions</h2><table id="versions"><thead><tr><th>package</th><th>version</th></tr></thead>',
                f"<tbody>{rows}</tbody></table>",
                "<h2>Configuration</h2><p>The workflow's effective configuration (config files, profile and command-line "
                "values merged, schema defaults filled in).</p>",
                f'<pre id="config">{esc(config)}</pre>',
                "</body></html>",
            ]
        )
        + "\n"
    )


def write_run_info(
    config_json: str, snakemake_version: str | None, prefix: str | Path, *, overwrite: bool = False
) -> list[Path]:
    """PREFIX.html and PREFIX.json (prefix targets, appearing together; pmlm.outputs)."""
    paths = prefix_targets(prefix, RUN_INFO_SUFFIXES, overwrite=overwrite)
    info = collect(config_json, snakemake_version)
    with writing_files(paths) as temps:
        for tmp, text in zip(temps, (page(info), json.dumps(info, indent=1, sort_keys=True) + "\n")):
            Path(tmp).write_text(text)
    return paths
