module example.invalid/gotest

go 1.26
