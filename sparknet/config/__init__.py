"""What a script is told and how it is checked: the mix config's schema (`mix`), the command line over a script's
constants (`cli`), the rule each setting passes before any work (`checks`, with the Hub's licence ids in
`licenses`), and saved identities against today's settings (`identity`). torchtitan keeps its job config and
command line in a `config/` folder too."""
