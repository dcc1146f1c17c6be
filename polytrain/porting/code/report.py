"""What ``polytrain port-code`` did to each file: the lines with framework uses, the lines
whose every use was converted, and the APIs left in place with their counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Use:
    """One framework use: its line in the source, the API, and why it was not converted
    (empty when it was)."""

    line: int
    api: str
    why: str = ""

    @property
    def converted(self) -> bool:
        return not self.why


@dataclass
class FileReport:
    """One file's uses. A line counts as converted when every use on it was."""

    path: str
    uses: list[Use] = field(default_factory=list)

    @property
    def lines(self) -> set[int]:
        return {u.line for u in self.uses}

    @property
    def converted_lines(self) -> set[int]:
        left = {u.line for u in self.uses if not u.converted}
        return self.lines - left

    @property
    def unconverted(self) -> Counter[str]:
        return Counter(u.api for u in self.uses if not u.converted)

    @property
    def rate(self) -> float:
        return len(self.converted_lines) / len(self.lines) if self.lines else 1.0

    def reasons(self) -> dict[str, str]:
        """The first reason given for each API left in place."""
        found: dict[str, str] = {}
        for u in self.uses:
            if not u.converted:
                found.setdefault(u.api, u.why)
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "framework_lines": len(self.lines),
            "converted_lines": len(self.converted_lines),
            "rate": round(self.rate, 4),
            "unconverted": dict(self.unconverted),
        }


@dataclass
class Report:
    """Every file of one run."""

    files: list[FileReport]

    @property
    def all_converted(self) -> bool:
        return all(not f.unconverted for f in self.files)

    def totals(self) -> tuple[int, int]:
        return (
            sum(len(f.lines) for f in self.files),
            sum(len(f.converted_lines) for f in self.files),
        )

    def format(self, show_unsupported: bool = False) -> str:
        rows = []
        for f in self.files:
            left = sum(f.unconverted.values())
            rows.append(
                f"{f.path}: {len(f.converted_lines)}/{len(f.lines)} lines with framework "
                f"calls converted ({f.rate:.0%}), {left} use(s) left marked"
            )
            if show_unsupported:
                reasons = f.reasons()
                for api, count in f.unconverted.most_common():
                    rows.append(f"  {count} x {api}: {reasons[api]}")
        total, done = self.totals()
        rate = done / total if total else 1.0
        rows.append(
            f"total: {done}/{total} lines converted ({rate:.0%}) in {len(self.files)} file(s)"
        )
        if not show_unsupported and not self.all_converted:
            merged: Counter[str] = Counter()
            for f in self.files:
                merged.update(f.unconverted)
            listed = ", ".join(f"{api} ({n})" for api, n in merged.most_common(8))
            rows.append(f"not converted: {listed} (--show-unsupported for the reasons)")
        return "\n".join(rows)
