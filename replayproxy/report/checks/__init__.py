"""Check results (.rpc) in `replayproxy report`: a check file as a typed document (`summary`,
`document_types`), its verdict and gate values (`verdict`), its tables (`tables`), and the part of
the report that tells inputs apart and puts these together (`report`)."""
