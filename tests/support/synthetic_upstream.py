"""Files of the synthetic upstream that more than one test module needs."""

GATE_1_0 = """\
def admit(prompt_tokens: int, free_slots: int) -> bool:
    \"\"\"Admit a request if its prompt fits.\"\"\"
    reserve = 0
    needed = prompt_tokens
    return needed <= free_slots


def padding() -> int:
    return 0
"""
