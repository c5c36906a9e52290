package main

import (
	"context"
	"io"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

const proxySummary = "sandboxd proxy bridges stdin and stdout to the daemon's unix socket, for the exec-worker's route through the Kubernetes exec API."

func proxy(ctx context.Context, args []string, lookupEnv config.LookupEnv, in io.Reader, out io.Writer) error {
	var socket string
	fs := config.New("sandboxd proxy", lookupEnv)
	fs.String(&socket, "socket", "KUBECLIP_SANDBOXD_SOCKET", sandboxd.DefaultSocket, "the daemon's unix socket")
	if err := fs.Parse(args); err != nil {
		fs.Usage(out, proxySummary) // only asked for by a person: no client is on stdout then
		return cli.Usage(err)
	}
	return sandboxd.Proxy(ctx, socket, in, out)
}
