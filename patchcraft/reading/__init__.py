"""Reading SGLang's source without running it: the class graph and edit sites (ast), the byte prefilter, the setter sandbox, server flags, the hub cache, fusion reading."""
