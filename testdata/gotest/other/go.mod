module example.invalid/gotestother

go 1.26
