"""One module per decoder family edge builds graphs for, named as GGUF's `general.architecture`, each
defining `TRAITS` (an `edge.models.arch.ArchTraits`); `edge.models.arch.traits_for` finds it by name."""
