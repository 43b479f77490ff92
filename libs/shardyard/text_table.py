"""Plain-text tables for the terminal: each column as wide as its widest cell, columns two spaces apart. Shared by
the CLI's renderings (``shardyard.cli.render``) and the simulator's report (``shardyard.sim.report``)."""


def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
