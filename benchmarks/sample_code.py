"""Code the speculative-decoding benchmarks ask the model to edit (prompt lookup's case: the answer copies it)."""

CODE = """def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(line.split(","))
    return rows


def total(rows, col):
    return sum(float(r[col]) for r in rows)
"""
# the same with one more function: longer answers to copy
CODE_LONGER = (
    CODE
    + """

def average(rows, col):
    if not rows:
        return 0.0
    return total(rows, col) / len(rows)
"""
)
