"""Prompts the real-model tests share."""

# an editing prompt: the answer repeats the code it was given, so model-free drafters find matches
EDIT_PROMPT = """Rename the variable `total` to `running_sum` in this code and return the whole code.

def accumulate(values):
    total = 0
    for v in values:
        total = total + v
        print("total so far:", total)
    return total

Answer:
def accumulate(values):
"""
