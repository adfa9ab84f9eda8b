"""Stack trees merged across ranks, and the hang verdicts read from them.

Shared contract: the agent pre-merges its local ranks' stacks and explains its
hang verdicts with this code, and the console merges the hosts' trees and folds
the same verdicts with it, so both sides print the same sentences.
"""
