"""What is here: ``polytrain backends``, ``polytrain data`` and ``polytrain doctor``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from polytrain.cli.output import make_console, make_table
from polytrain.errors import BackendError, PolytrainError


def cmd_backends(args: argparse.Namespace) -> int:
    """List registered backends; import only the ones named on the command line."""
    from polytrain.plugins.registry import default_plugin_manager, get_backend, registered_backends

    infos = registered_backends()
    rows = []
    report = []
    for name, info in infos.items():
        entry: dict[str, Any] = {
            "name": name,
            "framework": info.framework,
            "version": info.version(),
            "installed": info.available(),
            "devices": None,
            "capabilities": info.capabilities.to_dict(),  # declared, no import
        }
        if not entry["installed"]:
            entry["install"] = info.install_hint  # the plugin's own hint (or why not here)
        if name in args.names and info.available():
            try:
                backend = get_backend(name)
                entry["devices"] = [backend.device_name(d) for d in backend.try_all_gpus()]
                entry["importable"] = True
            except PolytrainError as exc:
                entry["importable"] = False
                entry["error"] = str(exc)
        report.append(entry)
        devices = ",".join(entry["devices"]) if entry["devices"] else None
        install = "yes" if entry["installed"] else f"no: {info.install_hint}"
        rows.append(
            [name, info.framework, entry["version"], install, devices or "(name it to probe)"]
        )
    for name, error in default_plugin_manager().broken.items():
        rows.append([name, "?", None, f"broken plugin: {error}", None])
        report.append({"name": name, "broken": error})
    unknown = [n for n in args.names if n not in infos]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        make_console().print(
            make_table(
                "polytrain backends",
                ["backend", "framework", "version", "installed", "devices"],
                rows,
            )
        )
    if unknown:
        get_backend(unknown[0])  # raises the standard "Unknown backend" error
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    """Where each dataset was found, or how to get it; optionally download."""
    from polytrain.data import dataset_names, fetch_dataset, locate_dataset

    names = args.names or dataset_names()
    reports = []
    for name in names:
        if args.download:
            report = fetch_dataset(name, args.data_dir)
        else:
            report = locate_dataset(name, args.data_dir)
        reports.append(report)
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2, default=str))
    else:
        for report in reports:
            print(report.format())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """What works here: imports, devices, threads, precisions, collectives."""
    from polytrain.cli.doctor import run_doctor, summary_rows, why_not
    from polytrain.plugins.registry import registered_backends

    names = args.names or list(registered_backends())
    unknown = [name for name in names if name not in registered_backends()]
    if unknown:
        raise BackendError(
            f"Unknown backend {unknown[0]!r}; registered: {', '.join(registered_backends())}. "
            "polytrain doctor probes registered backends (installed or not)."
        )
    reports = run_doctor(names, collectives=not args.no_collectives, progress=not args.json)
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    console = make_console()
    columns = ["backend", "version", "devices", "threads", "precisions (tiny step)",
               "2-process allreduce"]  # fmt: skip
    console.print(make_table("polytrain doctor", columns, summary_rows(reports)))
    for line in why_not(reports):
        console.print(f"  why not: {line}", highlight=False, markup=False)
    return 0
