"""Export trained models to other inference runtimes (CTranslate2)."""
